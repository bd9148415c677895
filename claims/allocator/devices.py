"""What one allocation attempt may take: the devices held by allocated claims (a baseline shared by the
attempts on one snapshot), counters and capacity in use, and the per-device checks (selectors, capacity,
taints, counters).
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from claims.allocator.baseline import counters_of, from_nothing
from claims.allocator.nodes import tolerates
from claims.allocator.pools import Pool, device_on_node, gather_pools, qty
from claims.allocator.requests import Candidate, ClaimData, Request, policy_amount
from claims.allocator.snapshot import CEL_RUNTIME, DeviceKey, Fatal, Features, FleetSnapshot, Obj
from claims.cel import CelRuntimeError


class DeviceState:
    """Devices, counters and capacity in use on one node, and whether a device can serve a request."""

    def __init__(self, claims: list[Obj], node: Obj, snapshot: FleetSnapshot, features: Features) -> None:
        self.claims = claims
        self.node = node
        self.snapshot = snapshot
        self.features = features
        self.pools = gather_pools(node, snapshot, features)
        baseline = snapshot._baseline
        if baseline is None or baseline.size != (len(snapshot.slices), len(snapshot.allocated_claims)):
            # A live fleet's snapshots bring what was kept of the last one's up to date
            # (claims.allocator.baseline); another is summed once.
            kept = snapshot.allocated
            baseline = snapshot._baseline = (
                from_nothing(snapshot) if kept is None else kept.baseline(snapshot)
            )
        # in_use is only read; the counters are changed (and undone) during the search: copy them.
        self.in_use: set[DeviceKey] = baseline.in_use
        self.shared: set[DeviceKey] = baseline.shared
        # Shares of a multi-allocatable device made in this attempt: its counters are charged by the first.
        self.sharing: dict[DeviceKey, int] = {}
        self.counter_use: dict[tuple[str, str, str, str], Fraction] = dict(baseline.counter_use)
        self.capacity_use: dict[tuple[DeviceKey, str], Fraction] = dict(baseline.capacity_use)
        self.claim_data: list[ClaimData] = []
        self.results: list[list[tuple[Request, Candidate, dict[str, Fraction] | None]]] = []
        self.allocating: set[DeviceKey] = set()

    def _consume_counters(self, key: DeviceKey, device: Obj, sign: int) -> None:
        for ck, amount in counters_of(key, device):
            self.counter_use[ck] = self.counter_use.get(ck, Fraction(0)) + sign * amount

    # -- setup

    # -- per-device checks

    def _devices(self, pool: Pool) -> Iterable[Candidate]:
        for s in pool.slices:
            for device in (s.get("spec") or {}).get("devices") or []:
                yield Candidate((pool.driver, pool.name, device.get("name", "")), device, s, pool)

    def _selectable(self, claim_name: str, request: Request, c: Candidate) -> bool:
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
                    raise Fatal(
                        f"{where}: selector #{i} on device {device_id}: CEL runtime error: {message}",
                        CEL_RUNTIME,
                    ) from None
        if (c.slice.get("spec") or {}).get("perDeviceNodeSelection"):
            return device_on_node(self.node, c.device)
        return True

    def _capacity_for(self, request: Request, c: Candidate, static: bool) -> dict[str, Fraction] | None:
        """Consumed capacity per key if the device can serve the request, else None (upstream:
        ``structured/internal/incubating/consumable_capacity.go`` of k8s.io/dynamic-resource-allocation)."""
        if not self.features.consumable_capacity:
            return {}
        capacity = c.device.get("capacity") or {}
        if any(name not in capacity for name in request.capacity_requests):
            return None
        consumed: dict[str, Fraction] = {}
        for name, cap in capacity.items():
            total = qty((cap or {}).get("value", "0"))
            amount = policy_amount(request.capacity_requests.get(name), cap or {}, total)
            if amount is None:
                return None
            used = Fraction(0) if static else self.capacity_use.get((c.key, name), Fraction(0))
            if used + amount > total:
                return None
            consumed[name] = amount
        return consumed

    def _tolerated(self, request: Request, device: Obj) -> bool:
        if not self.features.device_taints:
            return True
        for taint in device.get("taints") or []:
            if taint.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            if not any(tolerates(t, taint) for t in request.tolerations):
                return False
        return True

    def _counters_fit(self, c: Candidate, already_charged: bool) -> bool:
        consumptions = c.device.get("consumesCounters") or []
        if consumptions and not self.features.partitionable_devices:
            return False
        if already_charged:
            return True
        for consumption in consumptions:
            available = c.pool.counters.get(consumption.get("counterSet", ""), {})
            for counter, value in (consumption.get("counters") or {}).items():
                ck = (c.key[0], c.key[1], consumption.get("counterSet", ""), counter)
                need = qty((value or {}).get("value"))
                if self.counter_use.get(ck, Fraction(0)) + need > available.get(counter, Fraction(0)):
                    return False
        return True

    # -- search
