"""The diagnosis result: its categories, the per-device outcomes of a request in the allocator's order of
checks, and :class:`Diagnosis`, the object the CLI, the API and the pages show.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

Obj = dict[str, Any]

CATEGORIES = (
    "fits",
    "capacity",
    "no-match",
    "fragmentation",
    "constraint",
    "taint",
    "pool",
    "class-missing",
    "cel-error",
    "too-many",
    "not-created",
    "unsupported",
)
NO_SUCH_KEY_HINT = (
    ". consider using CEL optional chaining (.? followed by orValue()) or guarding the check with has() "
    "for optional fields"
)

# Per-device outcome of one (sub)request, in the allocator's order of checks.
SELECTOR, CAPACITY, POOL, ALLOCATED, TAINT, COUNTERS, FREE, ERROR = (
    "selector",
    "capacity",
    "pool",
    "allocated",
    "taint",
    "counters",
    "free",
    "cel-error",
)


@dataclass
class Diagnosis:
    """The result object of ``explain``, ``POST /api/v1/whatif`` and ``/claims/{id}/diagnosis``."""

    category: str
    summary: str
    requests: list[Obj] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    placement: Obj | None = None
    lint: list[Obj] = field(default_factory=list)
    claim: str = ""
    pod: str = ""
    scheduler_message: str = ""

    def as_dict(self) -> Obj:
        return asdict(self)
