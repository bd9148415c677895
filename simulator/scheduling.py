"""The seam between the simulator and a scheduler: the simulator asks, a `Schedule` callable decides.

The real decision logic (a replay of the structured allocator) lives in claims/allocator/; the simulator
only needs this small contract, so it never imports `claims` (fleet must not depend on claims). Until the
real one is wired in, `naive_schedule.naive_schedule` is the stand-in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]  # (driver, pool, device)


class ClusterState(Protocol):
    """Read-only view of the cluster handed to a scheduler. Objects must not be mutated."""

    def objects(self, kind: str) -> Iterable[Obj]:
        """Current objects of a kind ("Node", "ResourceSlice", "DeviceClass", "ResourceClaim", …)."""
        ...

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None: ...

    def allocated_devices(self) -> Mapping[DeviceKey, str]:
        """Devices named in some claim's allocation (adminAccess results excluded) -> "ns/claim"."""
        ...

    def slices_by_node(self) -> Mapping[str, list[Obj]]:
        """Highest-generation ResourceSlices grouped by spec.nodeName."""
        ...


@dataclass(frozen=True)
class Decision:
    """Outcome of one scheduling attempt for a pod.

    Success: `node` is set and `allocations` maps "namespace/claim" to the allocation results
    ({request, driver, pool, device[, adminAccess]}) of each claim that was not allocated yet.
    Failure: `node` is None, `message` is what the scheduler would report and `reason` is "Unschedulable"
    (no node fits) or "SchedulerError" (the attempt aborted, e.g. a CEL runtime error).
    """

    node: str | None = None
    allocations: Mapping[str, list[Obj]] = field(default_factory=dict)
    message: str = ""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.node is not None

    @classmethod
    def success(cls, node: str, allocations: Mapping[str, list[Obj]]) -> Decision:
        return cls(node=node, allocations=dict(allocations))

    @classmethod
    def failure(cls, message: str, reason: str = "Unschedulable") -> Decision:
        if reason not in ("Unschedulable", "SchedulerError"):
            raise ValueError(f"unexpected failure reason {reason!r}")
        return cls(message=message, reason=reason)


class Schedule(Protocol):
    """`schedule(pod, claims, state) -> Decision`; `claims` are the pod's ResourceClaims in pod order."""

    def __call__(self, pod: Obj, claims: list[Obj], state: ClusterState) -> Decision: ...
