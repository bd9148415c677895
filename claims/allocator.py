"""A replay of the structured allocator (incubating, dynamic-resource-allocation v0.37.2) over raw dicts.

It answers "could these claims be allocated on this node, and with which devices?" with the same first-fit,
depth-first search and the same messages as the kube-scheduler DynamicResources plugin (dra-reference §5).

Not implemented: DeviceTaintRules (only taints published on devices count), binding conditions (pools with
them are not put last, bindsToNode is only used for the node selector), ListTypeAttributes, compatibility
groups, derived attributes, the Filter timeout, scoring of firstAvailable, allocated-claim nodeSelector
checks (pass only unallocated claims) and the per-node counter/capacity validation details of ``buildPool``
beyond duplicate device names and unknown counter references.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from claims.cel import (
    MISSING,
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    DeviceView,
    compile_selector,
    device_view,
    evaluate,
    parse_qualified_name,
)
from fleet.quantity import QuantityError, parse_quantity

__all__ = [
    "DEFAULT_FEATURES",
    "AllocationResult",
    "Features",
    "FleetSnapshot",
    "ScheduleResult",
    "SelectorStats",
    "allocate",
    "node_matches",
    "policy_amount",
    "schedule_pod",
]

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
    _index: _SliceIndex | None = field(default=None, repr=False)
    _baseline: _Baseline | None = field(default=None, repr=False)

    @classmethod
    def from_objects(cls, objs: Iterable[Obj]) -> FleetSnapshot:
        """Sort ResourceSlices, DeviceClasses, allocated ResourceClaims and Nodes; ignore other kinds."""
        snapshot = cls()
        for obj in objs:
            kind = obj.get("kind")
            name = (obj.get("metadata") or {}).get("name", "")
            if kind == "ResourceSlice":
                snapshot.slices.append(obj)
            elif kind == "DeviceClass":
                snapshot.classes[name] = obj
            elif kind == "ResourceClaim" and (obj.get("status") or {}).get("allocation"):
                snapshot.allocated_claims.append(obj)
            elif kind == "Node":
                snapshot.nodes[name] = obj
        return snapshot

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
                tuple(_typed(view.lookup(*ref)) for ref in sorted(selector.references)),
            )
        cache_key = (selector.expression, projection)
        cached = self._results.get(cache_key)
        if cached is None:
            self.stats.evaluations += 1
            try:
                cached = evaluate(selector, view)
            except CelRuntimeError as exc:
                cached = exc
            self._results[cache_key] = cached
        else:
            self.stats.saved += 1
        if isinstance(cached, CelRuntimeError):
            raise cached
        return cached


def _typed(value: object) -> tuple[str, object]:
    if isinstance(value, list):  # a list-valued attribute: hashable for the cache key
        return ("list", tuple(_typed(v) for v in value))
    return (type(value).__name__, value)


@dataclass
class _SliceIndex:
    """Slices by nodeName, the node-less ones, and all slices per pool: built once per snapshot so that
    gathering the pools of one node does not scan the whole fleet (valid while ``slices`` is unchanged)."""

    size: int
    by_node: dict[str, list[Obj]]
    other: list[Obj]
    by_pool: dict[tuple[str, str], list[Obj]]


@dataclass
class _Baseline:
    """Devices in use and counters/capacity consumed by the snapshot's allocated claims."""

    size: tuple[int, int]
    in_use: set[DeviceKey]
    shared: set[DeviceKey]
    counter_use: dict[tuple[str, str, str, str], Fraction]
    capacity_use: dict[tuple[DeviceKey, str], Fraction]


def _slice_index(snapshot: FleetSnapshot) -> _SliceIndex:
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
            by_pool.setdefault(_slice_key(s), []).append(s)
        index = snapshot._index = _SliceIndex(len(snapshot.slices), by_node, other, by_pool)
    return index


@dataclass
class AllocationResult:
    """``ok`` with ``allocations`` (claim "ns/name" → ``status.allocation``), or a failure.

    ``kind`` is "unschedulable" (this node cannot hold all claims) or "error" (the attempt aborts, pod
    reason SchedulerError); ``message`` is the scheduler's text for it."""

    ok: bool
    kind: str = ""
    message: str = ""
    allocations: dict[str, Obj] = field(default_factory=dict)


@dataclass
class ScheduleResult:
    """The first node where all claims fit, or the FailedScheduling-style message."""

    node: str | None
    message: str
    allocations: dict[str, Obj] = field(default_factory=dict)
    per_node: dict[str, AllocationResult] = field(default_factory=dict)


class _Fatal(Exception):
    pass


# ------------------------------------------------------------------------------------------- node match


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _klog(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace", "")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


def _requirement_matches(req: Obj, values: Mapping[str, str], key: str) -> bool:
    op = req.get("operator")
    wanted = req.get("values") or []
    present = key in values
    if op == "In":
        return present and values[key] in wanted
    if op == "NotIn":
        return not present or values[key] not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, limit = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > limit if op == "Gt" else have < limit
    return False


def _selector_matches(selector: Obj, node: Obj) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": _name(node)}
    for term in selector.get("nodeSelectorTerms") or []:
        expressions, field_reqs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not expressions and not field_reqs:
            continue  # an empty term matches nothing
        if all(_requirement_matches(r, labels, r.get("key", "")) for r in expressions) and all(
            _requirement_matches(r, fields, r.get("key", "")) for r in field_reqs
        ):
            return True
    return False


def node_matches(node: Obj, node_name: str, all_nodes: bool, selector: Obj | None) -> bool:
    """``NodeMatches``: exactly one of nodeName / allNodes / nodeSelector decides."""
    if node_name:
        return node_name == _name(node)
    if all_nodes:
        return True
    if selector is not None:
        return _selector_matches(selector, node)
    return False


# ----------------------------------------------------------------------------------------------- pools


@dataclass
class _Pool:
    driver: str
    name: str
    slices: list[Obj] = field(default_factory=list)  # device slices targeting the node, sorted by name
    counters: dict[str, dict[str, Fraction]] = field(default_factory=dict)
    incomplete: bool = False
    invalid: str = ""

    @property
    def pool_id(self) -> str:
        return f"{self.driver}/{self.name}"


def _slice_key(s: Obj) -> tuple[str, str]:
    spec = s.get("spec") or {}
    return (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))


def _generation(s: Obj) -> int:
    return int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0))


def _qty(value: Any) -> Fraction:
    return parse_quantity(str(value)).value


def _gather_pools(node: Obj, snapshot: FleetSnapshot, features: Features) -> list[_Pool]:
    by_pool: dict[tuple[str, str], list[Obj]] = {}
    index = _slice_index(snapshot)
    for s in [*index.by_node.get(_name(node), []), *index.other]:
        spec = s.get("spec") or {}
        if not features.partitionable_devices and (
            spec.get("perDeviceNodeSelection") or spec.get("sharedCounters")
        ):
            continue
        if spec.get("nodeName") or spec.get("allNodes") or spec.get("nodeSelector") is not None:
            relevant = node_matches(
                node, spec.get("nodeName", ""), bool(spec.get("allNodes")), spec.get("nodeSelector")
            )
        elif spec.get("perDeviceNodeSelection"):
            relevant = any(_device_on_node(node, d) for d in spec.get("devices") or [])
        else:
            continue
        if not relevant:
            continue
        current = by_pool.get(_slice_key(s))
        if current is None or _generation(s) > _generation(current[0]):
            by_pool[_slice_key(s)] = [s]
        elif _generation(s) == _generation(current[0]):
            current.append(s)
    pools: list[_Pool] = []
    for (driver, pool_name), slices in by_pool.items():
        generation = _generation(slices[0])
        count = int(((slices[0].get("spec") or {}).get("pool") or {}).get("resourceSliceCount", 1))
        if len(slices) == count:
            # Complete from this node's view: upstream uses it as is, without looking for a newer
            # generation elsewhere (a pool moving between nodes stays usable on the old one until
            # its slices there are gone).
            pools.append(_build_pool(driver, pool_name, slices, slices, features))
            continue
        all_for_pool = index.by_pool.get((driver, pool_name), [])
        if any(_generation(s) > generation for s in all_for_pool):
            continue  # obsolete: a newer generation exists elsewhere
        at_generation = [s for s in all_for_pool if _generation(s) == generation]
        if len(at_generation) != count:
            pools.append(_Pool(driver, pool_name, incomplete=True))
            continue
        pools.append(_build_pool(driver, pool_name, slices, at_generation, features))
    pools.sort(key=lambda p: (p.driver, p.name))
    return pools


def _device_on_node(node: Obj, device: Obj) -> bool:
    return node_matches(
        node, device.get("nodeName", ""), bool(device.get("allNodes")), device.get("nodeSelector")
    )


def _build_pool(
    driver: str, name: str, slices: list[Obj], all_slices: list[Obj], features: Features
) -> _Pool:
    pool = _Pool(driver, name)
    pool.slices = sorted(
        (
            s
            for s in slices
            if not (features.partitionable_devices and (s.get("spec") or {}).get("sharedCounters"))
        ),
        key=_name,
    )
    seen: set[str] = set()
    for s in pool.slices:
        for device in (s.get("spec") or {}).get("devices") or []:
            if device.get("name") in seen:
                pool.invalid = f"duplicate device name {device.get('name')}"
                return pool
            seen.add(device.get("name", ""))
    for s in all_slices:
        for counter_set in (s.get("spec") or {}).get("sharedCounters") or []:
            pool.counters[counter_set.get("name", "")] = {
                k: _qty((v or {}).get("value", "0")) for k, v in (counter_set.get("counters") or {}).items()
            }
    for s in pool.slices:
        for device in (s.get("spec") or {}).get("devices") or []:
            for consumption in device.get("consumesCounters") or []:
                known = pool.counters.get(consumption.get("counterSet", ""))
                if known is None or any(c not in known for c in consumption.get("counters") or {}):
                    pool.invalid = f"device {device.get('name')} consumes unknown counters"
                    return pool
    return pool


# --------------------------------------------------------------------------------------------- requests


@dataclass
class _Request:
    """One exact request or one subrequest of a firstAvailable request."""

    name: str  # "req" or "req/sub"
    parent: str
    spec: Obj
    class_name: str
    selectors: list[CompiledSelector]
    class_selectors: list[CompiledSelector]
    count: int
    all_mode: bool
    admin_access: bool
    tolerations: list[Obj]
    capacity_requests: dict[str, Fraction]
    all_devices: list[_Candidate] = field(default_factory=list)


@dataclass
class _ClaimData:
    claim: Obj
    requests: list[list[_Request]]  # per spec request: [exact] or subrequests in order
    constraints: list[_Constraint]


@dataclass
class _Candidate:
    key: DeviceKey
    device: Obj
    slice: Obj
    pool: _Pool


class _Constraint:
    def __init__(self, requests: list[str], attribute: str, distinct: bool) -> None:
        self.requests = set(requests)
        self.attribute = attribute
        self.distinct = distinct
        self.values: list[object] = []

    def applies(self, request: str) -> bool:
        if not self.requests:
            return True
        return request in self.requests or request.split("/", 1)[0] in self.requests

    def lookup(self, driver: str, device: Obj) -> object:
        attributes = device.get("attributes") or {}
        if self.attribute in attributes:
            return _freeze(attributes[self.attribute])
        domain, ident = parse_qualified_name(self.attribute, driver)
        if domain == driver and ident in attributes:
            return _freeze(attributes[ident])
        return MISSING

    def add(self, request: str, driver: str, device: Obj) -> bool:
        if not self.applies(request):
            return True
        value = self.lookup(driver, device)
        if value is MISSING:
            return False
        if self.distinct:
            if value in self.values:
                return False
        elif self.values and value != self.values[0]:
            return False
        self.values.append(value)
        return True

    def remove(self, request: str) -> None:
        if self.applies(request):
            self.values.pop()


def _freeze(raw: Any) -> object:
    return tuple(sorted((k, str(v) if isinstance(v, list) else v) for k, v in (raw or {}).items()))


def _compile(expr: str, where: str) -> CompiledSelector:
    try:
        return compile_selector(expr)
    except CelCompileError as exc:
        raise _Fatal(f"{where}: CEL compile error: {exc.message}") from None


def _selectors(
    spec_selectors: list[Obj], where: str, claim_name: str, request_name: str
) -> list[CompiledSelector]:
    out: list[CompiledSelector] = []
    for i, sel in enumerate(spec_selectors or []):
        expr = ((sel or {}).get("cel") or {}).get("expression")
        if not expr:
            raise _Fatal(
                f"claim {claim_name}, request {request_name}, selector #{i}: CEL expression empty "
                "(unsupported selector type?)"
            )
        out.append(_compile(expr, f"{where}: selector #{i}"))
    return out


def _make_request(
    claim: Obj, name: str, parent: str, spec: Obj, admin: bool, snapshot: FleetSnapshot, features: Features
) -> _Request:
    claim_name = _klog(claim)
    class_name = spec.get("deviceClassName", "")
    if not class_name:
        raise _Fatal(
            f"claim {claim_name}, request {name}: missing device class name (unsupported request type?)"
        )
    device_class = snapshot.classes.get(class_name)
    if device_class is None:
        raise _Fatal(f"request {name}: device class {class_name} does not exist")
    if admin and not features.admin_access:
        raise _Fatal(
            f"claim {claim_name}, request {name}: admin access is requested, but the feature is disabled"
        )
    capacity = ((spec.get("capacity") or {}).get("requests")) or {}
    if capacity and not features.consumable_capacity:
        # Upstream names a subrequest by its own name here, not as "request/subrequest".
        what = f"subrequest {name.rpartition('/')[2]}" if name != parent else f"request {name}"
        raise _Fatal(
            f"claim {claim_name}, {what}: has capacity requests, but the DRAConsumableCapacity "
            "feature is disabled"
        )
    mode = spec.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise _Fatal(f"claim {claim_name}, request {name}: unsupported count mode {mode}")
    return _Request(
        name=name,
        parent=parent,
        spec=spec,
        class_name=class_name,
        selectors=_selectors(spec.get("selectors") or [], f"claim {claim_name}", claim_name, name),
        class_selectors=_selectors(
            (device_class.get("spec") or {}).get("selectors") or [], f"class {class_name}", claim_name, name
        ),
        count=int(spec.get("count", 1)) if mode == "ExactCount" else 0,
        all_mode=mode == "All",
        admin_access=admin,
        tolerations=list(spec.get("tolerations") or []),
        capacity_requests={k: _qty(v) for k, v in capacity.items()},
    )


# ------------------------------------------------------------------------------------------- allocator


class _Allocator:
    def __init__(self, claims: list[Obj], node: Obj, snapshot: FleetSnapshot, features: Features) -> None:
        self.claims = claims
        self.node = node
        self.snapshot = snapshot
        self.features = features
        self.pools = _gather_pools(node, snapshot, features)
        baseline = snapshot._baseline
        if baseline is None or baseline.size != (len(snapshot.slices), len(snapshot.allocated_claims)):
            self.in_use: set[DeviceKey] = set()
            self.shared: set[DeviceKey] = set()
            self.counter_use: dict[tuple[str, str, str, str], Fraction] = {}
            self.capacity_use: dict[tuple[DeviceKey, str], Fraction] = {}
            self._index_allocated()
            baseline = snapshot._baseline = _Baseline(
                (len(snapshot.slices), len(snapshot.allocated_claims)),
                self.in_use,
                self.shared,
                dict(self.counter_use),
                dict(self.capacity_use),
            )
        # in_use is only read; the counters are changed (and undone) during the search: copy them.
        self.in_use = baseline.in_use
        self.shared = baseline.shared
        # Shares of a multi-allocatable device made in this attempt: its counters are charged by the first.
        self.sharing: dict[DeviceKey, int] = {}
        self.counter_use = dict(baseline.counter_use)
        self.capacity_use = dict(baseline.capacity_use)
        self.claim_data: list[_ClaimData] = []
        self.results: list[list[tuple[_Request, _Candidate, dict[str, Fraction] | None]]] = []
        self.allocating: set[DeviceKey] = set()

    # -- state of existing allocations

    def _device_lookup(self) -> dict[DeviceKey, Obj]:
        found: dict[DeviceKey, Obj] = {}
        for s in self.snapshot.slices:
            driver, pool = _slice_key(s)
            for device in (s.get("spec") or {}).get("devices") or []:
                found[(driver, pool, device.get("name", ""))] = device
        return found

    def _index_allocated(self) -> None:
        devices: dict[DeviceKey, Obj] | None = None
        for claim in self.snapshot.allocated_claims:
            results = (
                (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            ) or []
            for result in results:
                if result.get("adminAccess"):
                    continue
                key = (result.get("driver", ""), result.get("pool", ""), result.get("device", ""))
                consumed = result.get("consumedCapacity")
                # Only a result with a shareID is one share of a device; without it the device is
                # dedicated, even when it allows multiple allocations (allocateddevices.go).
                if result.get("shareID"):
                    for name, value in (consumed or {}).items():
                        self.capacity_use[(key, name)] = self.capacity_use.get(
                            (key, name), Fraction(0)
                        ) + _qty(value)
                    self.shared.add(key)
                else:
                    self.in_use.add(key)
        # An allocated device consumes its counters once, however many claims share it.
        for key in self.in_use | self.shared:
            if devices is None:
                devices = self._device_lookup()
            device = devices.get(key)
            if device is not None:
                self._consume_counters(key, device, +1)

    def _consume_counters(self, key: DeviceKey, device: Obj, sign: int) -> None:
        for consumption in device.get("consumesCounters") or []:
            for counter, value in (consumption.get("counters") or {}).items():
                ck = (key[0], key[1], consumption.get("counterSet", ""), counter)
                self.counter_use[ck] = self.counter_use.get(ck, Fraction(0)) + sign * _qty(
                    (value or {}).get("value")
                )

    # -- setup

    def prepare(self) -> None:
        for claim in self.claims:
            claim_name = _klog(claim)
            devices_spec = (claim.get("spec") or {}).get("devices") or {}
            requests: list[list[_Request]] = []
            min_total = 0
            for request in devices_spec.get("requests") or []:
                name = request.get("name", "")
                if request.get("firstAvailable"):
                    if not self.features.prioritized_list:
                        raise _Fatal(
                            f"claim {claim_name}, request {name}: has subrequests, but the "
                            "DRAPrioritizedList feature is disabled"
                        )
                    subs = [
                        _make_request(
                            claim,
                            f"{name}/{sub.get('name', '')}",
                            name,
                            sub,
                            False,
                            self.snapshot,
                            self.features,
                        )
                        for sub in request["firstAvailable"]
                    ]
                elif request.get("exactly"):
                    exact = request["exactly"]
                    subs = [
                        _make_request(
                            claim,
                            name,
                            name,
                            exact,
                            bool(exact.get("adminAccess")),
                            self.snapshot,
                            self.features,
                        )
                    ]
                else:
                    raise _Fatal(f"resource claim {claim_name}, request {name}: unknown request type")
                for sub in subs:
                    if sub.all_mode:
                        self._collect_all(claim_name, sub)
                min_devices = min(len(s.all_devices) if s.all_mode else s.count for s in subs)
                if min_devices > MAX_RESULTS - min_total:
                    raise _Fatal(
                        f"claim {claim_name}, request {name}: adding {min_devices} devices exceeds the claim "
                        f"limit of {MAX_RESULTS}, with {min_total} already accounted for"
                    )
                min_total += min_devices
                requests.append(subs)
            constraints: list[_Constraint] = []
            for i, constraint in enumerate(devices_spec.get("constraints") or []):
                if constraint.get("matchAttribute"):
                    constraints.append(
                        _Constraint(constraint.get("requests") or [], constraint["matchAttribute"], False)
                    )
                elif constraint.get("distinctAttribute"):
                    constraints.append(
                        _Constraint(constraint.get("requests") or [], constraint["distinctAttribute"], True)
                    )
                else:
                    message = "empty constraint (unsupported constraint type?)"
                    raise _Fatal(f"claim {claim_name}, constraint #{i}: {message}")
            self.claim_data.append(_ClaimData(claim, requests, constraints))
            self.results.append([])

    def _collect_all(self, claim_name: str, request: _Request) -> None:
        for pool in self.pools:
            if pool.incomplete:
                raise _Fatal(
                    f"claim {claim_name}, request {request.name}: asks for all devices, but resource pool "
                    f"{pool.pool_id} is currently being updated"
                )
            if pool.invalid:
                raise _Fatal(
                    f"claim {claim_name}, request {request.name}: asks for all devices, but resource pool "
                    f"{pool.pool_id} is currently invalid"
                )
            for candidate in self._devices(pool):
                if not self._selectable(claim_name, request, candidate):
                    continue
                if self._capacity_for(request, candidate, True) is not None:
                    request.all_devices.append(candidate)

    # -- per-device checks

    def _devices(self, pool: _Pool) -> Iterable[_Candidate]:
        for s in pool.slices:
            for device in (s.get("spec") or {}).get("devices") or []:
                yield _Candidate((pool.driver, pool.name, device.get("name", "")), device, s, pool)

    def _selectable(self, claim_name: str, request: _Request, c: _Candidate) -> bool:
        if not self.features.device_binding_and_status and c.device.get("bindingConditions"):
            return False  # devices with binding conditions are not supported with the gates off
        view = self.snapshot.view(c.key[0], c.key[1], c.device)
        device_id = "/".join(c.key)
        for where, selectors in (
            (f"class {request.class_name}", request.class_selectors),
            (f"claim {claim_name}", request.selectors),
        ):
            for i, selector in enumerate(selectors):
                try:
                    if not self.snapshot.matches(selector, view, c.key):
                        return False
                except CelRuntimeError as exc:
                    message = exc.message
                    if "no such key:" in message:
                        message += (
                            ". consider using CEL optional chaining (.? followed by orValue()) or guarding "
                            "the check with has() for optional fields"
                        )
                    raise _Fatal(
                        f"{where}: selector #{i} on device {device_id}: CEL runtime error: {message}"
                    ) from None
        if (c.slice.get("spec") or {}).get("perDeviceNodeSelection"):
            return _device_on_node(self.node, c.device)
        return True

    def _capacity_for(self, request: _Request, c: _Candidate, static: bool) -> dict[str, Fraction] | None:
        """Consumed capacity per key if the device can serve the request, else None (§5.5)."""
        if not self.features.consumable_capacity:
            return {}
        capacity = c.device.get("capacity") or {}
        if any(name not in capacity for name in request.capacity_requests):
            return None
        consumed: dict[str, Fraction] = {}
        for name, cap in capacity.items():
            total = _qty((cap or {}).get("value", "0"))
            amount = policy_amount(request.capacity_requests.get(name), cap or {}, total)
            if amount is None:
                return None
            used = Fraction(0) if static else self.capacity_use.get((c.key, name), Fraction(0))
            if used + amount > total:
                return None
            consumed[name] = amount
        return consumed

    def _tolerated(self, request: _Request, device: Obj) -> bool:
        if not self.features.device_taints:
            return True
        for taint in device.get("taints") or []:
            if taint.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            if not any(_tolerates(t, taint) for t in request.tolerations):
                return False
        return True

    def _counters_fit(self, c: _Candidate, already_charged: bool) -> bool:
        consumptions = c.device.get("consumesCounters") or []
        if consumptions and not self.features.partitionable_devices:
            return False
        if already_charged:
            return True
        for consumption in consumptions:
            available = c.pool.counters.get(consumption.get("counterSet", ""), {})
            for counter, value in (consumption.get("counters") or {}).items():
                ck = (c.key[0], c.key[1], consumption.get("counterSet", ""), counter)
                need = _qty((value or {}).get("value"))
                if self.counter_use.get(ck, Fraction(0)) + need > available.get(counter, Fraction(0)):
                    return False
        return True

    # -- search

    def allocate_device(
        self, ci: int, request: _Request, c: _Candidate, must: bool
    ) -> Callable[[], None] | None:
        shared = bool(c.device.get("allowMultipleAllocations")) and self.features.consumable_capacity
        # A device held exclusively (by an allocated claim or this attempt) cannot be shared either.
        if not request.admin_access and (c.key in self.in_use or c.key in self.allocating):
            return None
        if request.admin_access and any(r[1].key == c.key for r in self.results[ci]):
            return None  # admin access may reuse devices, but not within the same claim
        consumed = self._capacity_for(request, c, False) if shared or request.capacity_requests else {}
        # A shared device's counters are charged by its first share only (upstream: skipCounterCheck).
        already_charged = shared and (c.key in self.shared or self.sharing.get(c.key, 0) > 0)
        if (
            consumed is None
            or not self._counters_fit(c, already_charged)
            or not self._tolerated(request, c.device)
        ):
            return None
        constraints = self.claim_data[ci].constraints
        added: list[_Constraint] = []
        for constraint in constraints:
            if not constraint.add(request.name, c.key[0], c.device):
                for done in added:
                    done.remove(request.name)
                if must:
                    claim_name = _klog(self.claim_data[ci].claim)
                    raise _Fatal(
                        f"claim {claim_name}, request {request.name}: cannot add device "
                        f"{'/'.join(c.key)} because a claim constraint would not be satisfied"
                    )
                return None
            added.append(constraint)
        # Admin access marks the device too, so that a later ordinary request cannot take it.
        marked = not shared and c.key not in self.allocating
        if marked:
            self.allocating.add(c.key)
        if shared:
            for name, amount in consumed.items():
                self.capacity_use[(c.key, name)] = self.capacity_use.get((c.key, name), Fraction(0)) + amount
            self.sharing[c.key] = self.sharing.get(c.key, 0) + 1
        charge = not already_charged  # admin access too: upstream reserves its counters like any other
        if charge:
            self._consume_counters(c.key, c.device, +1)
        self.results[ci].append((request, c, consumed if shared else None))

        def undo() -> None:
            self.results[ci].pop()
            if charge:
                self._consume_counters(c.key, c.device, -1)
            if shared:
                self.sharing[c.key] -= 1
                for name, amount in consumed.items():
                    self.capacity_use[(c.key, name)] -= amount
            if marked:
                self.allocating.discard(c.key)
            for done in added:
                done.remove(request.name)

        return undo

    def allocate_one(self, ci: int, ri: int, sub: int | None, di: int, start: int) -> bool:
        if ci >= len(self.claim_data):
            return True
        data = self.claim_data[ci]
        if ri >= len(data.requests):
            return self.allocate_one(ci + 1, 0, None, 0, 0)
        subs = data.requests[ri]
        if sub is None:
            return any(self.allocate_one(ci, ri, index, 0, 0) for index in range(len(subs)))
        request = subs[sub]
        wanted = len(request.all_devices) if request.all_mode else request.count
        if request.all_mode and not request.all_devices:
            return False  # "at least one device is required"
        if di >= wanted:
            return self.allocate_one(ci, ri + 1, None, 0, 0)
        if len(self.results[ci]) >= MAX_RESULTS:
            return False
        claim_name = _klog(data.claim)
        if request.all_mode:
            undo = self.allocate_device(ci, request, request.all_devices[di], True)
            if undo is None:
                return False
            if self.allocate_one(ci, ri, sub, di + 1, 0):
                return True
            undo()
            return False
        position = 0
        for pool in self.pools:
            if pool.incomplete or pool.invalid:
                continue
            for candidate in self._devices(pool):
                position += 1
                if position <= start:
                    continue
                # "Checking for in use is cheap and thus gets done first": an allocated device's
                # selectors are never evaluated, so a CEL error on it cannot abort scheduling.
                if not request.admin_access and (
                    candidate.key in self.in_use or candidate.key in self.allocating
                ):
                    continue
                if not self._selectable(claim_name, request, candidate):
                    continue
                undo = self.allocate_device(ci, request, candidate, False)
                if undo is None:
                    continue
                if self.allocate_one(ci, ri, sub, di + 1, position):
                    return True
                undo()
        return False

    # -- results

    def allocations(self) -> dict[str, Obj]:
        out: dict[str, Obj] = {}
        for ci, data in enumerate(self.claim_data):
            results: list[Obj] = []
            selectors: list[Obj] = []
            pinned = False
            for request, c, consumed in self.results[ci]:
                result: Obj = {
                    "request": request.name,
                    "driver": c.key[0],
                    "pool": c.key[1],
                    "device": c.key[2],
                }
                if request.admin_access:
                    result["adminAccess"] = True
                if request.tolerations:
                    result["tolerations"] = request.tolerations
                if consumed is not None:
                    result["shareID"] = str(uuid.uuid4())
                    result["consumedCapacity"] = {k: _format_quantity(v) for k, v in consumed.items()}
                for key in ("bindingConditions", "bindingFailureConditions"):
                    if c.device.get(key):
                        result[key] = list(c.device[key])
                results.append(result)
                spec = c.slice.get("spec") or {}
                source = c.device if spec.get("perDeviceNodeSelection") else spec
                if source.get("nodeName") or c.device.get("bindsToNode"):
                    pinned = True
                elif source.get("nodeSelector"):
                    selectors.append(source["nodeSelector"])
            allocation: Obj = {"devices": {"results": results}}
            node_selector = _node_selector(_name(self.node), pinned, selectors)
            if node_selector is not None:
                allocation["nodeSelector"] = node_selector
            out[_klog(data.claim)] = allocation
        return out


def _node_selector(node: str, pinned: bool, selectors: list[Obj]) -> Obj | None:
    if pinned:
        return {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    if not selectors:
        return None
    term: Obj = {}
    for selector in selectors:
        for source in (selector.get("nodeSelectorTerms") or [])[:1]:
            for key in ("matchExpressions", "matchFields"):
                for req in source.get(key) or []:
                    if req not in term.setdefault(key, []):
                        term[key].append(req)
    return {"nodeSelectorTerms": [term]}


def _format_quantity(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    milli = value * 1000
    return f"{milli.numerator}m" if milli.denominator == 1 else f"{float(value)}"


def policy_amount(requested: Fraction | None, cap: Obj, total: Fraction) -> Fraction | None:
    """Consumed amount for one capacity key (``calculateConsumedCapacity``); None when the device's
    requestPolicy cannot grant ``requested``."""
    policy = cap.get("requestPolicy")
    if requested is None:
        if policy and policy.get("default") is not None:
            return _qty(policy["default"])
        return total
    if not policy:
        return requested
    valid_values = policy.get("validValues")
    if valid_values:
        for value in sorted(_qty(v) for v in valid_values):
            if value >= requested:
                return value
        return None
    valid_range = policy.get("validRange")
    if valid_range:
        minimum = _qty(valid_range.get("min", "0"))
        if requested < minimum:
            requested = minimum
        step = valid_range.get("step")
        if step:
            step_q = _qty(step)
            steps = -((minimum - requested) // step_q)  # ceil
            requested = minimum + steps * step_q
        maximum = valid_range.get("max")
        if maximum is not None and requested > _qty(maximum):
            return None
    return requested


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key", "")
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if not key:
        return False  # an empty key requires operator Exists
    return bool(toleration.get("value", "") == taint.get("value", ""))


def allocate(
    claims: list[Obj], node: str, snapshot: FleetSnapshot, *, features: Features = DEFAULT_FEATURES
) -> AllocationResult:
    """Try to allocate all ``claims`` (unallocated, in pod order) on ``node``."""
    node_obj = snapshot.nodes.get(node) or {"metadata": {"name": node, "labels": {}}}
    try:
        allocator = _Allocator(claims, node_obj, snapshot, features)
        allocator.prepare()
        if allocator.allocate_one(0, 0, None, 0, 0):
            return AllocationResult(ok=True, allocations=allocator.allocations())
    except _Fatal as exc:
        return AllocationResult(ok=False, kind="error", message=str(exc))
    except (QuantityError, ValueError) as exc:
        return AllocationResult(ok=False, kind="error", message=f"gather pool information: {exc}")
    if any(pool.invalid for pool in allocator.pools):
        return AllocationResult(
            ok=False, kind="unschedulable", message="invalid resource pools were encountered"
        )
    return AllocationResult(ok=False, kind="unschedulable", message="cannot allocate all claims")


def schedule_pod(pod: Obj, claims: list[Obj], snapshot: FleetSnapshot) -> ScheduleResult:
    """Filter every node (no scoring): the first fitting node in name order wins, unless some node's
    Filter fails fatally. The scheduler filters all nodes in parallel and a fatal error aborts the
    attempt even when another node fits (an ``All`` request on an incomplete pool, a CEL error)."""
    names = sorted(snapshot.nodes) or sorted(
        {(s.get("spec") or {}).get("nodeName", "") for s in snapshot.slices} - {""}
    )
    per_node: dict[str, AllocationResult] = {}
    for name in names:
        result = allocate(claims, name, snapshot)
        per_node[name] = result
        if result.kind == "error":
            return ScheduleResult(
                None, f'running "DynamicResources" filter plugin: {result.message}', {}, per_node
            )
    fitting = next((name for name in names if per_node[name].ok), None)
    if fitting is not None:
        return ScheduleResult(fitting, "", per_node[fitting].allocations, per_node)
    histogram: dict[str, int] = {}
    for result in per_node.values():
        histogram[result.message] = histogram.get(result.message, 0) + 1
    reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(histogram.items()))
    message = f"0/{len(names)} nodes are available" + (f": {reasons}." if reasons else ".")
    return ScheduleResult(None, message, {}, per_node)
