"""Claim requests compiled for the search: device class and claim selectors, allocation mode and count,
tolerations, requested capacity (and its policy), and match/distinct-attribute constraints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from claims.allocator.nodes import klog
from claims.allocator.pools import Pool, qty
from claims.allocator.snapshot import (
    CLASS_MISSING,
    UNSUPPORTED,
    DeviceKey,
    Fatal,
    Features,
    FleetSnapshot,
    Obj,
)
from claims.cel import MISSING, CelCompileError, CompiledSelector, compile_selector, parse_qualified_name


@dataclass
class Request:
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
    all_devices: list[Candidate] = field(default_factory=list)

    @property
    def alternative(self) -> bool:
        """Whether this is one subrequest of a firstAvailable request ("req/sub")."""
        return self.name != self.parent


@dataclass
class ClaimData:
    claim: Obj
    requests: list[list[Request]]  # per spec request: [exact] or subrequests in order
    constraints: list[Constraint]


@dataclass
class Candidate:
    key: DeviceKey
    device: Obj
    slice: Obj
    pool: Pool


class Constraint:
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
        raise Fatal(f"{where}: CEL compile error: {exc.message}") from None


# The allocator's words for a selector that is not CEL (a type this API version does not know); lint and
# the diagnosis say the same.
SELECTOR_WITHOUT_CEL = "CEL expression empty (unsupported selector type?)"


def _selectors(
    spec_selectors: list[Obj], where: str, claim_name: str, request_name: str
) -> list[CompiledSelector]:
    out: list[CompiledSelector] = []
    for i, sel in enumerate(spec_selectors or []):
        expr = ((sel or {}).get("cel") or {}).get("expression")
        if not expr:
            raise Fatal(
                f"claim {claim_name}, request {request_name}, selector #{i}: {SELECTOR_WITHOUT_CEL}",
                UNSUPPORTED,
            )
        out.append(_compile(expr, f"{where}: selector #{i}"))
    return out


def make_request(
    claim: Obj, name: str, parent: str, spec: Obj, admin: bool, snapshot: FleetSnapshot, features: Features
) -> Request:
    claim_name = klog(claim)
    class_name = spec.get("deviceClassName", "")
    if not class_name:
        raise Fatal(
            f"claim {claim_name}, request {name}: missing device class name (unsupported request type?)",
            UNSUPPORTED,
        )
    device_class = snapshot.classes.get(class_name)
    if device_class is None:
        raise Fatal(f"request {name}: device class {class_name} does not exist", CLASS_MISSING)
    if admin and not features.admin_access:
        raise Fatal(
            f"claim {claim_name}, request {name}: admin access is requested, but the feature is disabled",
            UNSUPPORTED,
        )
    capacity = ((spec.get("capacity") or {}).get("requests")) or {}
    if capacity and not features.consumable_capacity:
        # Upstream names a subrequest by its own name here, not as "request/subrequest".
        what = f"subrequest {name.rpartition('/')[2]}" if name != parent else f"request {name}"
        raise Fatal(
            f"claim {claim_name}, {what}: has capacity requests, but the DRAConsumableCapacity "
            "feature is disabled",
            UNSUPPORTED,
        )
    mode = spec.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise Fatal(f"claim {claim_name}, request {name}: unsupported count mode {mode}", UNSUPPORTED)
    return Request(
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
        capacity_requests={k: qty(v) for k, v in capacity.items()},
    )


def format_quantity(value: Fraction) -> str:
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
            return qty(policy["default"])
        return total
    if not policy:
        return requested
    valid_values = policy.get("validValues")
    if valid_values:
        for value in sorted(qty(v) for v in valid_values):
            if value >= requested:
                return value
        return None
    valid_range = policy.get("validRange")
    if valid_range:
        minimum = qty(valid_range.get("min", "0"))
        if requested < minimum:
            requested = minimum
        step = valid_range.get("step")
        if step:
            step_q = qty(step)
            steps = -((minimum - requested) // step_q)  # ceil
            requested = minimum + steps * step_q
        maximum = valid_range.get("max")
        if maximum is not None and requested > qty(maximum):
            return None
    return requested
