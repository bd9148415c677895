"""What the allocator reads and returns: the fleet snapshot (slices, classes, allocated claims, with its
per-snapshot caches), the feature gates, and the allocation and scheduling results.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from claims.cel import CelRuntimeError, CompiledSelector, DeviceView, device_view, evaluate

if TYPE_CHECKING:
    from claims.allocator.baseline import Allocated

MAX_RESULTS = 32  # resourceapi.AllocationResultsMaxSize
Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True)
class Features:
    """Feature gates the allocator honours (1.36/1.37 defaults: all on)."""

    admin_access: bool = True
    prioritized_list: bool = True
    partitionable_devices: bool = True
    device_taints: bool = True
    consumable_capacity: bool = True
    device_binding_and_status: bool = True  # DRADeviceBindingConditions + DRAResourceClaimDeviceStatus


DEFAULT_FEATURES = Features()


@dataclass
class SelectorStats:
    """How often selectors ran, and how many runs were saved by sharing results between devices."""

    evaluations: int = 0
    saved: int = 0


@dataclass
class FleetSnapshot:
    """Raw objects the allocator looks at. Build with ``from_objects``."""

    slices: list[Obj] = field(default_factory=list)
    classes: dict[str, Obj] = field(default_factory=dict)
    allocated_claims: list[Obj] = field(default_factory=list)
    nodes: dict[str, Obj] = field(default_factory=dict)
    stats: SelectorStats = field(default_factory=SelectorStats)
    _views: dict[DeviceKey, DeviceView] = field(default_factory=dict, repr=False)
    _results: dict[tuple[str, Any], bool | CelRuntimeError] = field(default_factory=dict, repr=False)
    _index: SliceIndex | None = field(default=None, repr=False)
    _baseline: Baseline | None = field(default=None, repr=False)
    # What the last snapshot of a live fleet kept of its baseline (claims.allocator.baseline); None: made
    # from nothing.
    allocated: Allocated | None = field(default=None, repr=False)

    @classmethod
    def from_objects(cls, objs: Iterable[Obj]) -> FleetSnapshot:
        """Sort ResourceSlices, DeviceClasses, allocated ResourceClaims and Nodes; ignore other kinds."""
        kinds: dict[object, list[Obj]] = {
            "ResourceSlice": [],
            "DeviceClass": [],
            "ResourceClaim": [],
            "Node": [],
        }
        for obj in objs:
            listed = kinds.get(obj.get("kind"))
            if listed is not None:
                listed.append(obj)
        return cls.from_kinds(
            kinds["ResourceSlice"], kinds["DeviceClass"], kinds["ResourceClaim"], kinds["Node"]
        )

    @classmethod
    def from_kinds(
        cls,
        slices: list[Obj],
        classes: Iterable[Obj],
        claims: Iterable[Obj],
        nodes: Iterable[Obj],
        allocated: list[Obj] | None = None,
    ) -> FleetSnapshot:
        """The snapshot of objects already listed by kind (``slices`` is taken, not copied): no
        dispatch of every object by its ``kind`` (55,000 at L, for each state of a live fleet).
        ``allocated``: the claims with an allocation, when the caller keeps them (taken, not copied)."""

        def named(objs: Iterable[Obj]) -> dict[str, Obj]:
            return {(o.get("metadata") or {}).get("name", ""): o for o in objs}

        if allocated is None:
            allocated = [c for c in claims if is_allocated(c)]
        return cls(slices=slices, classes=named(classes), allocated_claims=allocated, nodes=named(nodes))

    def view(self, driver: str, pool: str, device: Obj) -> DeviceView:
        key = (driver, pool, device.get("name", ""))
        found = self._views.get(key)
        if found is None:
            found = self._views[key] = device_view(driver, device)
        return found

    def matches(self, selector: CompiledSelector, view: DeviceView, key: DeviceKey) -> bool:
        """Evaluate once per distinct projection of what the selector reads. Raises CelRuntimeError."""
        if selector.opaque or view.attribute_error:
            projection: Any = ("device", key)
        else:
            projection = (
                view.driver if selector.reads_driver else None,
                view.allow_multiple_allocations,
                tuple(typed_value(view.lookup(*ref)) for ref in sorted(selector.references)),
            )
        cache_key = (selector.expression, projection)
        cached = self._results.get(cache_key)
        if cached is None:
            self.stats.evaluations += 1
            try:
                cached = evaluate(selector, view)
            except CelRuntimeError as exc:
                cached = CelRuntimeError(exc.expression, exc.message)
            self._results[cache_key] = cached
        else:
            self.stats.saved += 1
        if isinstance(cached, CelRuntimeError):
            # The cache keeps exceptions that are never raised: a raised one's traceback holds every frame
            # up the stack and, through this cache, the whole diagnosis update that ran it (a cycle, kept
            # until a full collection; for good in a worker that freezes what an update leaves).
            raise CelRuntimeError(cached.expression, cached.message)
        return cached


def typed_value(value: object) -> tuple[str, object]:
    if isinstance(value, list):  # a list-valued attribute: hashable for the cache key
        return ("list", tuple(typed_value(v) for v in value))
    return (type(value).__name__, value)


@dataclass
class SliceIndex:
    """Slices by nodeName, the node-less ones, and all slices per pool: built once per snapshot so that
    gathering the pools of one node does not scan the whole fleet (valid while ``slices`` is unchanged)."""

    size: int
    by_node: dict[str, list[Obj]]
    other: list[Obj]
    by_pool: dict[tuple[str, str], list[Obj]]


@dataclass
class Baseline:
    """Devices in use and counters/capacity consumed by the snapshot's allocated claims."""

    size: tuple[int, int]
    in_use: set[DeviceKey]
    shared: set[DeviceKey]
    counter_use: dict[tuple[str, str, str, str], Fraction]
    capacity_use: dict[tuple[DeviceKey, str], Fraction]


def slice_index(snapshot: FleetSnapshot) -> SliceIndex:
    index = snapshot._index
    if index is None or index.size != len(snapshot.slices):
        by_node: dict[str, list[Obj]] = {}
        other: list[Obj] = []
        by_pool: dict[tuple[str, str], list[Obj]] = {}
        for s in snapshot.slices:
            node_name = (s.get("spec") or {}).get("nodeName")
            if node_name:
                by_node.setdefault(node_name, []).append(s)
            else:
                other.append(s)
            by_pool.setdefault(slice_key(s), []).append(s)
        index = snapshot._index = SliceIndex(len(snapshot.slices), by_node, other, by_pool)
    return index


@dataclass
class AllocationResult:
    """``ok`` with ``allocations`` (claim "ns/name" → ``status.allocation``), or a failure.

    ``kind`` is "unschedulable" (this node cannot hold all claims) or "error" (the attempt aborts, pod
    reason SchedulerError); ``message`` is the scheduler's text for it."""

    ok: bool
    kind: str = ""
    message: str = ""
    reason: str = ""  # of an "error": Fatal.reason
    allocations: dict[str, Obj] = field(default_factory=dict)


@dataclass
class ScheduleResult:
    """The first node where all claims fit, or the FailedScheduling-style message."""

    node: str | None
    message: str
    allocations: dict[str, Obj] = field(default_factory=dict)
    per_node: dict[str, AllocationResult] = field(default_factory=dict)


class Fatal(Exception):
    """An attempt that aborts (the scheduler's SchedulerError); ``reason`` says which kind of abort, so
    that no reader has to find it in a message that also holds claim, class and selector text."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


# Fatal.reason values; "" for the others (CEL compile errors). UNSUPPORTED: a feature the scheduler has
# off, or a request, selector or mode this API version does not know (written for a newer one).
CEL_RUNTIME, CLASS_MISSING, CONSTRAINT, POOL_UNUSABLE, CLAIM_LIMIT, UNSUPPORTED = (
    "cel-runtime",
    "class-missing",
    "constraint",
    "pool",
    "claim-limit",
    "unsupported",
)


# kube-scheduler's words around a DynamicResources status that is an error, by extension point
# (framework/runtime/framework.go, v1.37.2). An unschedulable status is the pod's reason as it is, which
# the FitError puts after "0/N nodes are available: ".
PREFILTER_ERROR = 'running PreFilter plugin "DynamicResources": '
FILTER_ERROR = 'running "DynamicResources" filter plugin: '


def is_allocated(claim: Obj) -> bool:
    """Whether ``claim`` has an allocation: the snapshot's allocated claims."""
    return bool((claim.get("status") or {}).get("allocation"))


def slice_key(s: Obj) -> tuple[str, str]:
    spec = s.get("spec") or {}
    return (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))
