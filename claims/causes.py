"""Group diagnosed pending claims (and pods waiting for a claim) into causes, one summary line per group.

Pure: works on plain data, the diagnosis result dicts as stored in ``ClaimDiagnosis.result`` (see
``claims.diagnosis.Diagnosis``) plus each item's identity and age, so the pending page, the triage report
and the tests share it. ``group_causes(items)`` returns :class:`CauseGroup` objects, largest group first,
e.g. "9 want memory >= 150Gi: only B200, B300 match, all 24 held".

The grouping key comes from what the diagnosis says, never from claim names: the cluster, the category and
the distinguishing part of the blocking request (its device class and the device groups that match it, the
failing clause of a no-match, the attribute of a CEL error, the taints, the pool problems...). Claims that
want the same devices for the same reason therefore land in one group whatever their count or name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

Result = Mapping[str, Any]

UNDIAGNOSED = "undiagnosed"
EXAMPLES = 3

# Plain-language lead of each category in a group's summary line ("{n} {lead}").
_LEADS = {
    "capacity": "want",
    "fragmentation": "want",
    "taint": "want",
    "pool": "want",
    "constraint": "want",
    "no-match": "match no device",
    "cel-error": "fail with a CEL error",
    "class-missing": "ask for a missing device class",
    "too-many": "ask for more than 32 devices",
    "not-created": "have no claim: template claim not created",
    "unsupported": "use an unsupported API version or feature",
    "fits": "fit now",
    UNDIAGNOSED: "not diagnosed yet",
}


@dataclass(frozen=True)
class Brief:
    """What a list needs of a stored diagnosis without its result: the cause key :func:`cause_of` gave
    when it was stored, the category and the summary."""

    key: str
    category: str
    summary: str


@dataclass(frozen=True)
class Pending:
    """One pending claim, or one pod waiting for a claim that is not there (``kind="pod"``).

    ``since`` is when it started pending (the claim's or pod's creation); ``result`` its stored diagnosis
    (``None`` until the diagnosis task has run, or not read yet). ``brief``, when given, is what was
    stored beside the result, and is what groups the item (see :func:`cause_of`). ``ref`` is opaque to
    this module (e.g. a primary key)."""

    cluster: str
    namespace: str
    name: str
    since: datetime
    result: Result | None = None
    kind: str = "claim"
    pods: tuple[str, ...] = ()
    ref: Any = None
    brief: Brief | None = None

    @property
    def category(self) -> str:
        if self.brief is not None:
            return self.brief.category or UNDIAGNOSED
        return str((self.result or {}).get("category") or UNDIAGNOSED)

    @property
    def summary(self) -> str:
        if self.brief is not None:
            return self.brief.summary or "No diagnosis stored yet."
        return str((self.result or {}).get("summary") or "No diagnosis stored yet.")

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Cause:
    """What identifies a group: ``key`` is stable across recomputations and safe in a query string."""

    key: str
    cluster: str
    category: str
    parts: tuple[str, ...]


@dataclass
class CauseGroup:
    """Pending items that share one cause, oldest first."""

    key: str
    cluster: str
    category: str
    summary: str
    count: int
    members: list[Pending] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    suggestion: str = ""

    @property
    def oldest(self) -> datetime:
        return self.members[0].since


# ------------------------------------------------------------------------------------------- selectors

_PREFIX = re.compile(r"device\.(?:attributes|capacity)\[['\"][^'\"]+['\"]\]\.")
_COMPARE = re.compile(
    r"(\w+)\.compareTo\(\s*quantity\(\s*['\"]([^'\"]+)['\"]\s*\)\s*\)\s*(>=|<=|>|<|==|!=)\s*0"
)
_IS_GREATER = re.compile(r"(\w+)\.isGreaterThan\(\s*quantity\(\s*['\"]([^'\"]+)['\"]\s*\)\s*\)")
_IS_LESS = re.compile(r"(\w+)\.isLessThan\(\s*quantity\(\s*['\"]([^'\"]+)['\"]\s*\)\s*\)")
_QUANTITY = re.compile(r"quantity\(\s*['\"]([^'\"]+)['\"]\s*\)")


def plain_selector(expression: str) -> str:
    """A CEL selector as a person would say it: ``memory >= 150Gi`` for
    ``device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('150Gi')) >= 0``."""
    text = _PREFIX.sub("", expression.strip())
    text = _COMPARE.sub(lambda m: f"{m.group(1)} {m.group(3)} {m.group(2)}", text)
    text = _IS_GREATER.sub(lambda m: f"{m.group(1)} > {m.group(2)}", text)
    text = _IS_LESS.sub(lambda m: f"{m.group(1)} < {m.group(2)}", text)
    text = _QUANTITY.sub(lambda m: m.group(1), text)
    return re.sub(r"\s+", " ", text)


# ----------------------------------------------------------------------------------- request details


def _entries(result: Result) -> list[Mapping[str, Any]]:
    """The result's per-request details. Only objects: a stored result is read back from the database,
    where a malformed one must cost its own summary, not the page that groups it with others."""
    requests = result.get("requests")
    return [r for r in requests if isinstance(r, Mapping)] if isinstance(requests, list) else []


def _device_requests(result: Result) -> list[Mapping[str, Any]]:
    """The per-request details that carry device groups (a cel-error result also holds an error entry)."""
    return [r for r in _entries(result) if "groups" in r]


def _needed(request: Mapping[str, Any]) -> int:
    count = request.get("count")
    return count if isinstance(count, int) and count > 0 else 1


def blocking_request(result: Result) -> Mapping[str, Any] | None:
    """The request that explains the claim: the first with fewer free devices than it needs and some
    matching devices, else the first short of devices, else the first with device groups."""
    requests = _device_requests(result)
    short = [r for r in requests if int(r.get("free") or 0) < _needed(r)]
    for r in short:
        if int(r.get("matching") or 0) > 0:
            return r
    found = short or requests
    return found[0] if found else None


def _matching_groups(request: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [g for g in request.get("groups") or [] if int(g.get("matching") or 0) > 0]


def _label(group: Mapping[str, Any]) -> str:
    return f"{group.get('model', '')} {group.get('profile', '')}".strip() or "unknown"


def _labels(groups: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted({_label(g) for g in groups})


def _failing_clauses(request: Mapping[str, Any]) -> list[str]:
    return sorted(
        {str(g.get("failing_clause")) for g in request.get("groups") or [] if g.get("failing_clause")}
    )


_TEMPLATE = re.compile(r"from template (\S+?)(?::|\.$|$)")
_CLASS = re.compile(r"device class '([^']*)'|device class \"([^\"]*)\"")


def _parts(category: str, result: Result) -> tuple[str, ...]:
    """The distinguishing part of a diagnosis for its category (see the module docstring)."""
    request = blocking_request(result)
    if category in ("capacity", "fragmentation", "taint", "pool", "constraint") and request is not None:
        parts: tuple[str, ...] = (str(request.get("device_class", "")), *_labels(_matching_groups(request)))
        if category == "taint":
            parts += tuple(sorted({t for g in request.get("groups") or [] for t in g.get("taints") or {}}))
        if category == "pool":
            parts += tuple(
                sorted({p for g in request.get("groups") or [] for p in g.get("pool_problems") or []})
            )
        if category == "constraint":
            details = [r for r in _entries(result) if r.get("name") == "constraints"]
            parts += tuple(
                sorted(
                    f"{c.get('kind')}:{c.get('attribute')}"
                    for d in details
                    for c in d.get("constraints") or []
                )
            )
        return parts
    if category == "no-match" and request is not None:
        return (
            str(request.get("device_class", "")),
            *(_failing_clauses(request) or request.get("selectors") or []),
        )
    if category == "cel-error":
        first: Mapping[str, Any] = next((r for r in _entries(result) if "error" in r), {})
        return (str(first.get("attribute") or first.get("expression") or first.get("error") or ""),)
    if category == "class-missing":
        found = _CLASS.search(str(result.get("summary", "")))
        return (next((g for g in found.groups() if g is not None), "") if found else "",)
    if category == "not-created":
        found = _TEMPLATE.search(str(result.get("summary", "")))
        return (found.group(1) if found else "missing claim",)
    if category == "fits":
        suggestions = result.get("suggestions") or [""]
        return (str(suggestions[0]),)
    return ()


def cause_of(item: Pending) -> Cause:
    """The cause an item belongs to; ``key`` is ``{category}-{10 hex digits}`` (readable, URL-safe).

    An item with a :class:`Brief` has the key stored with its diagnosis (its ``parts`` are then empty):
    computed from the whole result, so a reader whose result was redacted groups it as everyone does."""
    if item.brief is not None:
        return Cause(item.brief.key, item.cluster, item.category, ())
    category = item.category
    parts = _parts(category, item.result or {})
    digest = hashlib.sha1("\x1f".join((item.cluster, category, *parts)).encode(), usedforsecurity=False)
    return Cause(f"{category}-{digest.hexdigest()[:10]}", item.cluster, category, parts)


# ---------------------------------------------------------------------------------------- summaries


def _want(request: Mapping[str, Any], labels: Sequence[str], prefer_labels: bool) -> str:
    selectors = [plain_selector(s) for s in request.get("selectors") or []]
    said = " and ".join(s for s in selectors if s)
    if said and not prefer_labels and len(said) <= 60:
        return said
    if labels:
        return ", ".join(labels)
    return said or f"a {request.get('device_class') or 'device'}"


def _group_summary(n: int, category: str, rep: Pending) -> str:
    """One line for a group of ``n`` items like ``rep`` (the oldest member, whose numbers it quotes)."""
    result = rep.result or {}
    lead = f"{n} {_LEADS.get(category, category)}"
    request = blocking_request(result)
    if request is None or category in (
        "cel-error",
        "class-missing",
        "too-many",
        "not-created",
        "fits",
        "unsupported",
    ):
        return _simple_summary(lead, category, result, rep)
    matching = _matching_groups(request)
    labels = _labels(matching)
    total = sum(int(g.get("matching") or 0) for g in matching)
    free = int(request.get("free") or 0)
    if category == "capacity":
        what = f"{lead} {_want(request, labels, prefer_labels=False)}"
        only = f"only {', '.join(labels)} match" if labels else "nothing matches"
        if free == 0:
            return f"{what}: {only}, all {total} held"
        best = max((int(g.get("max_free_on_one_node") or 0) for g in matching), default=0)
        return f"{what}: {only}, {free} of {total} free but at most {best} on one node"
    if category == "fragmentation":
        idle = request.get("idle_bigger_mig") or {}
        said = ", ".join(f"{k} {p} slices" for p, k in sorted(idle.items()))
        return f"{lead} {_want(request, labels, prefer_labels=True)}: none free" + (
            f", {said} idle" if said else ", parent GPUs' counters used up"
        )
    if category == "taint":
        taints = sorted({t for g in request.get("groups") or [] for t in g.get("taints") or {}})
        want = _want(request, labels, prefer_labels=False)
        return f"{lead} {want}: matching devices tainted ({', '.join(taints)})"
    if category == "pool":
        want = _want(request, labels, prefer_labels=False)
        return f"{lead} {want}: matching devices in incomplete or invalid pools"
    if category == "constraint":
        return f"{lead} {_want(request, labels, prefer_labels=False)}: constraints cannot be met on one node"
    if category == "no-match":
        clauses = [plain_selector(c) for c in _failing_clauses(request)] or [
            plain_selector(s) for s in request.get("selectors") or []
        ]
        nearest = next((str(g.get("reason")) for g in request.get("groups") or [] if g.get("reason")), "")
        return f"{lead}: {' and '.join(clauses) or 'no selector'}" + (
            f" (nearest: {nearest})" if nearest else ""
        )
    return f"{lead}: {rep.summary}"


def _simple_summary(lead: str, category: str, result: Result, rep: Pending) -> str:
    if category == "cel-error":
        first: Mapping[str, Any] = next((r for r in _entries(result) if "error" in r), {})
        attribute, expression = first.get("attribute"), first.get("expression")
        if attribute:
            return f"{lead}: no such key {attribute} in `{expression}`"
        return f"{lead}: `{expression}`" if expression else f"{lead}: {rep.summary}"
    if category in ("class-missing", "not-created"):
        parts = _parts(category, result)
        return f"{lead} ({parts[0]})" if parts and parts[0] else lead
    if category == "fits":
        # "Fits now on node n: 2 x B200 (gpu-0, gpu-1). <why it is still pending>."
        why = rep.summary.split("). ", 1)[-1].rstrip(".") if "). " in rep.summary else ""
        return f"{lead}, still pending: {why[:1].lower()}{why[1:]}" if why else lead
    return lead


# ------------------------------------------------------------------------------------------ grouping


def group_causes(
    items: Iterable[Pending],
    examples: int = EXAMPLES,
    read: Callable[[list[Pending]], list[Pending]] | None = None,
) -> list[CauseGroup]:
    """Items grouped by :func:`cause_of`: members oldest first, groups largest first (then oldest).

    A group's summary quotes its oldest member's result. Items listed by their :class:`Brief` alone get
    it from ``read``, given those members (one call) and returning them with their results: only they
    are read, not every member."""
    buckets: dict[str, tuple[Cause, list[Pending]]] = {}
    for item in items:
        cause = cause_of(item)
        buckets.setdefault(cause.key, (cause, []))[1].append(item)
    for _, members in buckets.values():
        members.sort(key=lambda m: (m.since, m.cluster, m.namespace, m.name))
    if read is not None:
        firsts = [members for _, members in buckets.values() if members[0].result is None]
        for members, first in zip(firsts, read([m[0] for m in firsts]), strict=True):
            members[0] = first
    groups = []
    for key, (cause, members) in buckets.items():
        rep = members[0]
        suggestions = (rep.result or {}).get("suggestions") or [""]
        groups.append(
            CauseGroup(
                key=key,
                cluster=cause.cluster,
                category=cause.category,
                summary=_group_summary(len(members), cause.category, rep),
                count=len(members),
                members=members,
                examples=[m.label for m in members[:examples]],
                suggestion=str(suggestions[0]),
            )
        )
    groups.sort(key=lambda g: (-g.count, g.oldest, g.key))
    return groups
