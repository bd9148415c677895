"""The depth-first, first-fit search of the structured allocator over the claims of one pod on one node,
and the entry points :func:`allocate` (claims on a node) and :func:`schedule_pod` (first node that fits).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from fractions import Fraction

from claims.allocator.config import allocation_config
from claims.allocator.devices import DeviceState
from claims.allocator.nodes import allocation_node_selector, klog, obj_name
from claims.allocator.requests import Candidate, ClaimData, Constraint, Request, format_quantity, make_request
from claims.allocator.snapshot import (
    CLAIM_LIMIT,
    CONSTRAINT,
    DEFAULT_FEATURES,
    FILTER_ERROR,
    MAX_RESULTS,
    POOL_UNUSABLE,
    UNSUPPORTED,
    AllocationResult,
    Fatal,
    Features,
    FleetSnapshot,
    Obj,
    ScheduleResult,
)
from fleet.quantity import QuantityError


class ResultsFull(Exception):
    """Upstream's errAllocationResultMaxSizeExceeded: the rest of a request cannot fit in the claim's
    MAX_RESULTS results. No other choice of devices before it can help, so it unwinds (undoing what it
    passes) to the nearest firstAvailable request, which tries its next alternative, before any other
    device's selectors are evaluated (one could fail at runtime where upstream never looks)."""


class Allocator(DeviceState):
    """One attempt: the claims' requests and constraints, the search, and the allocation results."""

    def prepare(self) -> None:
        for claim in self.claims:
            claim_name = klog(claim)
            devices_spec = (claim.get("spec") or {}).get("devices") or {}
            requests: list[list[Request]] = []
            min_total = 0
            for request in devices_spec.get("requests") or []:
                name = request.get("name", "")
                if request.get("firstAvailable"):
                    if not self.features.prioritized_list:
                        raise Fatal(
                            f"claim {claim_name}, request {name}: has subrequests, but the "
                            "DRAPrioritizedList feature is disabled",
                            UNSUPPORTED,
                        )
                    subs = [
                        make_request(
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
                        make_request(
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
                    raise Fatal(
                        f"resource claim {claim_name}, request {name}: unknown request type", UNSUPPORTED
                    )
                for sub in subs:
                    if sub.all_mode:
                        self._collect_all(claim_name, sub)
                min_devices = min(len(s.all_devices) if s.all_mode else s.count for s in subs)
                if min_devices > MAX_RESULTS - min_total:
                    raise Fatal(
                        f"claim {claim_name}, request {name}: adding {min_devices} devices exceeds the claim "
                        f"limit of {MAX_RESULTS}, with {min_total} already accounted for",
                        CLAIM_LIMIT,
                    )
                min_total += min_devices
                requests.append(subs)
            constraints: list[Constraint] = []
            for i, constraint in enumerate(devices_spec.get("constraints") or []):
                if constraint.get("matchAttribute"):
                    constraints.append(
                        Constraint(constraint.get("requests") or [], constraint["matchAttribute"], False)
                    )
                elif constraint.get("distinctAttribute"):
                    constraints.append(
                        Constraint(constraint.get("requests") or [], constraint["distinctAttribute"], True)
                    )
                else:
                    message = "empty constraint (unsupported constraint type?)"
                    raise Fatal(f"claim {claim_name}, constraint #{i}: {message}", UNSUPPORTED)
            self.claim_data.append(ClaimData(claim, requests, constraints))
            self.results.append([])

    def _collect_all(self, claim_name: str, request: Request) -> None:
        for pool in self.pools:
            if pool.incomplete:
                raise Fatal(
                    f"claim {claim_name}, request {request.name}: asks for all devices, but resource pool "
                    f"{pool.pool_id} is currently being updated",
                    POOL_UNUSABLE,
                )
            if pool.invalid:
                raise Fatal(
                    f"claim {claim_name}, request {request.name}: asks for all devices, but resource pool "
                    f"{pool.pool_id} is currently invalid",
                    POOL_UNUSABLE,
                )
            for candidate in self._devices(pool):
                if not self._selectable(claim_name, request, candidate):
                    continue
                if self._capacity_for(request, candidate, True) is not None:
                    request.all_devices.append(candidate)

    def allocate_device(
        self, ci: int, request: Request, c: Candidate, must: bool
    ) -> Callable[[], None] | None:
        shared = bool(c.device.get("allowMultipleAllocations")) and self.features.consumable_capacity
        # A device held exclusively (by an allocated claim or this attempt) cannot be shared either.
        if not request.admin_access and (c.key in self.in_use or c.key in self.allocating):
            return None
        if request.admin_access and self._dedicated_in_claim(ci, c):
            return None
        # A shared device's counters are charged by its first share only (upstream: skipCounterCheck).
        already_charged = shared and (c.key in self.shared or self.sharing.get(c.key, 0) > 0)
        if not self._counters_fit(c, already_charged) or not self._tolerated(request, c.device):
            return None
        constraints = self.claim_data[ci].constraints
        added: list[Constraint] = []
        for constraint in constraints:
            if not constraint.add(request.name, c.key[0], c.device):
                for done in added:
                    done.remove(request.name)
                if must:
                    claim_name = klog(self.claim_data[ci].claim)
                    raise Fatal(
                        f"claim {claim_name}, request {request.name}: cannot add device "
                        f"{'/'.join(c.key)} because a claim constraint would not be satisfied",
                        CONSTRAINT,
                    )
                return None
            added.append(constraint)
        # Capacity comes after the constraints, as upstream orders allocateDevice: a device an
        # allocationMode All request must take fails on its constraint (fatal) before its capacity.
        consumed = self._capacity_for(request, c, False) if shared or request.capacity_requests else {}
        if consumed is None:
            for done in added:
                done.remove(request.name)
            return None
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

    def _dedicated_in_claim(self, ci: int, c: Candidate) -> bool:
        """Admin access may reuse devices, but not a dedicated one within the same claim (upstream:
        allocatingDeviceForClaim, which records dedicated devices only; shares stay reusable)."""
        shared = bool(c.device.get("allowMultipleAllocations")) and self.features.consumable_capacity
        return not shared and any(r[1].key == c.key for r in self.results[ci])

    def allocate_one(self, ci: int, ri: int, sub: int | None, di: int, start: int) -> bool:
        if ci >= len(self.claim_data):
            return True
        data = self.claim_data[ci]
        if ri >= len(data.requests):
            try:
                return self.allocate_one(ci + 1, 0, None, 0, 0)
            except ResultsFull:
                return False  # another claim's limit: this claim may still fit otherwise
        subs = data.requests[ri]
        if sub is None:
            if not subs[0].alternative:  # an exact request: nothing to fall back on
                return self.allocate_one(ci, ri, 0, 0, 0)
            every_full = True
            for index in range(len(subs)):
                try:
                    if self.allocate_one(ci, ri, index, 0, 0):
                        return True
                except ResultsFull:
                    continue  # the next alternative may want fewer devices
                every_full = False
            if every_full:
                raise ResultsFull  # no choice before this request can help either
            return False
        request = subs[sub]
        wanted = len(request.all_devices) if request.all_mode else request.count
        if request.all_mode and not request.all_devices:
            return False  # "at least one device is required"
        if di >= wanted:
            return self.allocate_one(ci, ri + 1, None, 0, 0)
        if wanted - di > MAX_RESULTS - len(self.results[ci]):
            raise ResultsFull
        claim_name = klog(data.claim)
        if request.all_mode:
            undo = self.allocate_device(ci, request, request.all_devices[di], True)
            if undo is None:
                return False
            try:
                done = self.allocate_one(ci, ri, sub, di + 1, 0)
            except ResultsFull:
                undo()
                raise
            if done:
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
                if request.admin_access and self._dedicated_in_claim(ci, candidate):
                    continue
                if not request.admin_access and (
                    candidate.key in self.in_use or candidate.key in self.allocating
                ):
                    continue
                if not self._selectable(claim_name, request, candidate):
                    continue
                undo = self.allocate_device(ci, request, candidate, False)
                if undo is None:
                    continue
                try:
                    done = self.allocate_one(ci, ri, sub, di + 1, position)
                except ResultsFull:
                    undo()
                    raise
                if done:
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
                    result["consumedCapacity"] = {k: format_quantity(v) for k, v in consumed.items()}
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
            chosen = {request.parent: request for request, _, _ in self.results[ci]}
            config = allocation_config(data.claim, chosen, self.snapshot.classes)
            if config:
                allocation["devices"]["config"] = config
            node_selector = allocation_node_selector(obj_name(self.node), pinned, selectors)
            if node_selector is not None:
                allocation["nodeSelector"] = node_selector
            out[klog(data.claim)] = allocation
        return out


def allocate(
    claims: list[Obj], node: str, snapshot: FleetSnapshot, *, features: Features = DEFAULT_FEATURES
) -> AllocationResult:
    """Try to allocate all ``claims`` (unallocated, in pod order) on ``node``."""
    node_obj = snapshot.nodes.get(node) or {"metadata": {"name": node, "labels": {}}}
    try:
        allocator = Allocator(claims, node_obj, snapshot, features)
        allocator.prepare()
        if allocator.allocate_one(0, 0, None, 0, 0):
            return AllocationResult(ok=True, allocations=allocator.allocations())
    except Fatal as exc:
        return AllocationResult(ok=False, kind="error", message=str(exc), reason=exc.reason)
    except ResultsFull:
        # Upstream returns errAllocationResultMaxSizeExceeded from Allocate as it is (the claim limit
        # check before allocating makes this unreachable there too).
        return AllocationResult(ok=False, kind="error", message="allocation max size exceeded")
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
            return ScheduleResult(None, FILTER_ERROR + result.message, {}, per_node)
    fitting = next((name for name in names if per_node[name].ok), None)
    if fitting is not None:
        return ScheduleResult(fitting, "", per_node[fitting].allocations, per_node)
    histogram: dict[str, int] = {}
    for result in per_node.values():
        histogram[result.message] = histogram.get(result.message, 0) + 1
    reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(histogram.items()))
    message = f"0/{len(names)} nodes are available" + (f": {reasons}." if reasons else ".")
    return ScheduleResult(None, message, {}, per_node)
