"""Upstream's structured-allocator test table, as data for claimscope's allocator replay.

``allocator_table.json`` is recorded by ``dump/regenerate.sh`` from ``allocatortesting.TestAllocator`` in
k8s.io/dynamic-resource-allocation v0.37.2
(``staging/src/k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting/allocator_testing.go``
of Kubernetes v1.37.2): every table entry with the objects upstream's
allocator was given (in the Kubernetes JSON shape) and what it returned. Recording instead of hand-translating
keeps the 275 entries faithful; the table's own assertions ran during the recording, so each recorded outcome
is one upstream expects.

This module turns one entry into the engine's inputs and states which entries cannot apply, and why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from claims.allocator import Features, FleetSnapshot
from fleet.quantity import parse_quantity

TABLE = Path(__file__).with_name("allocator_table.json")
Obj = dict[str, Any]

# Gates of upstream's allocator that only its experimental channel supports in 1.37 and that claimscope's
# engine does not model (the docstring of claims/allocator/__init__.py names them under "Not implemented").
UNMODELLED_FEATURES = {
    "CompatibilityGroups": "compatibility groups of counter sets are not modelled by the engine",
    "DerivedAttributes": "derived attributes (exactly.derivedAttributes) are not modelled by the engine",
    "ListTypeAttributes": "list-typed device attributes are not modelled by the engine",
    "OptionalNodeOperations": "optional node operations (skipNodeOperations) are not modelled by the engine",
}

# Entries the engine cannot be fed, by upstream name. Each reason is listed in tests/controlplane/FINDINGS.md.
SKIPPED: dict[str, str] = {
    "prioritized-list-max-allocation-limit-request": (
        "the engine's search does not prune subrequests that cannot fit in the 32-result limit and runs for "
        "minutes (upstream answers at once); skipped so the suite stays fast, listed as a defect"
    ),
    "several-different-drivers": "two claims share one name (claim-0); the engine reports results per "
    "namespace/name, which the API keeps unique",
}

# The scheduler plugin checks that every requested class exists before the allocator runs (PreFilter,
# pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go:862 in v1.37.2), so the allocator's own
# "could not retrieve device class" error never reaches a pod; the engine answers with the plugin's message.
_MISSING_CLASS = re.compile(r"^claim \S+, request (\S+): could not retrieve device class (\S+): ")

# Entries where the engine disagrees with upstream and is not fixed yet (strict: an xfail that starts passing
# fails the run, so the list cannot go stale). Each reason is listed in tests/controlplane/FINDINGS.md.
_INT64 = "the engine computes capacity with exact fractions, not aborting on values int64 cannot represent"
_LIST_ATTRIBUTES = (
    "list-valued attributes with the DRAListTypeAttributes gate off: the engine reads lists as lists "
    "(the launcher turns the gate on), upstream's gate-off view and constraints differ"
)
_POOL_VALIDATION = "the engine does not validate counter sets across a pool's slices (invalid pool missed)"
_COMPAT_GROUPS_OFF = (
    "with DRACompatibilityGroups off upstream ignores devices and pools using compatibility groups; "
    "the engine "
    "does not read compatibilityGroups at all"
)
KNOWN_DIFFERENCES: dict[str, str] = {
    "compatibility-groups-disabled-skips-grouped-pool": _COMPAT_GROUPS_OFF,
    "compatibility-groups-disabled-skips-ungrouped-device-in-grouped-pool": _COMPAT_GROUPS_OFF,
    "consumable-capacity-fractional-range-gate-disabled": (
        "the engine has no DRAConsumableCapacityFractionalRange gate: with it off upstream rounds in "
        "whole units"
    ),
    "consumable-capacity-negative-request-aborts": "the engine accepts a negative capacity request",
    "consumable-capacity-range-policy-allocation-mode-all-overflow-aborts": _INT64,
    "consumable-capacity-range-policy-overflow-aborts-not-skip": _INT64,
    "consumable-capacity-range-policy-request-above-int64-rejected": _INT64,
    "consumable-capacity-range-policy-rounded-value-overflow-rejected": _INT64,
    "consumable-capacity-requests-are-not-modified": (
        "a request equal to the policy default below validRange.min: upstream consumes the request, "
        "the engine "
        "rounds it up to min"
    ),
    "list-attributes-disabled-distinct-constraint-with-lists": _LIST_ATTRIBUTES,
    "with-distinct-constraints-unknown-type-attribute": _LIST_ATTRIBUTES,
    "partitionable-devices-same-counter-set-name-in-different-resource-slices": _POOL_VALIDATION,
    "partitionable-devices-validation-error-on-non-targeting-slice": _POOL_VALIDATION,
}


@dataclass(frozen=True)
class Case:
    name: str
    raw: Obj

    @property
    def features(self) -> list[str]:
        return list(self.raw.get("features") or [])

    def skip_reason(self) -> str | None:
        unmodelled = [UNMODELLED_FEATURES[f] for f in self.features if f in UNMODELLED_FEATURES]
        if unmodelled:
            return "; ".join(unmodelled)
        return SKIPPED.get(self.name)

    def engine_features(self) -> Features:
        on = set(self.features)
        return Features(
            admin_access="AdminAccess" in on,
            prioritized_list="PrioritizedList" in on,
            partitionable_devices="PartitionableDevices" in on,
            device_taints="DeviceTaints" in on,
            consumable_capacity="ConsumableCapacity" in on,
            device_binding_and_status="DeviceBindingAndStatus" in on,
        )

    @property
    def node(self) -> str:
        return str(self.raw["node"]["metadata"]["name"])

    def claims(self) -> list[Obj]:
        return [{"kind": "ResourceClaim", **claim} for claim in self.raw.get("claims") or []]

    def snapshot(self) -> FleetSnapshot:
        objs: list[Obj] = [{"kind": "DeviceClass", **c} for c in self.raw.get("classes") or []]
        objs += [{"kind": "ResourceSlice", **s} for s in self.raw.get("slices") or []]
        objs.append({"kind": "Node", **self.raw["node"]})
        objs += self._allocated_claims()
        return FleetSnapshot.from_objects(objs)

    def _allocated_claims(self) -> list[Obj]:
        """Upstream hands the allocator its AllocatedState (device ids, shared device ids, consumed
        capacity); the engine derives the same from allocated ResourceClaims, so each entry becomes one
        result of one allocated claim."""
        results: list[Obj] = []
        for driver, pool, device in self.raw.get("allocatedDevices") or []:
            results.append({"request": "req", "driver": driver, "pool": pool, "device": device})
        shared: dict[tuple[str, str, str], Obj] = {}
        for share in self.raw.get("allocatedSharedDeviceIDs") or []:
            key = (share["Driver"], share["Pool"], share["Device"])
            result = {"request": "req", "driver": key[0], "pool": key[1], "device": key[2]}
            result["shareID"] = share.get("ShareID") or "share"
            results.append(result)
            shared.setdefault(key, result)
        for entry in self.raw.get("aggregatedCapacity") or []:
            key = (entry["Driver"], entry["Pool"], entry["Device"])
            found = shared.get(key)
            if found is None:
                found = {"request": "req", "driver": key[0], "pool": key[1], "device": key[2]}
                found["shareID"] = "aggregated"
                results.append(found)
            found["consumedCapacity"] = dict(entry.get("Capacity") or {})
        if not results:
            return []
        return [
            {
                "kind": "ResourceClaim",
                "metadata": {"name": "allocated", "namespace": "upstream-allocated-state"},
                "spec": {"devices": {"requests": []}},
                "status": {"allocation": {"devices": {"results": results}}},
            }
        ]

    @property
    def expected_error(self) -> tuple[str, str] | None:
        """(kind, message) of the engine's failure, or None when upstream allocated (or found no fit)."""
        error = self.raw.get("error")
        if error is None:
            return None
        if self.raw.get("failedAllocationOnNode"):
            # Wraps ErrFailedAllocationOnNode: the scheduler reports it as unschedulable on this node.
            return ("unschedulable", str(error))
        missing = _MISSING_CLASS.match(error)
        if missing:
            return ("error", f"request {missing[1]}: device class {missing[2]} does not exist")
        return ("error", str(error))

    def expected_results(self) -> list[Obj]:
        return [normalize(r) for r in self.raw.get("results") or []]


def _quantities(values: Obj) -> dict[str, Fraction]:
    return {k: parse_quantity(str(v)).value for k, v in values.items()}


def normalize(allocation: Obj) -> Obj:
    """What both sides must agree on in one claim's ``status.allocation``: the devices per request, their
    flags, the config and the node selector; generated share ids compare as "present"."""
    devices = allocation.get("devices") or {}
    results = []
    for result in devices.get("results") or []:
        out: Obj = {k: result[k] for k in ("request", "driver", "pool", "device") if k in result}
        if result.get("adminAccess"):
            out["adminAccess"] = True
        for key in ("tolerations", "bindingConditions", "bindingFailureConditions"):
            if result.get(key):
                out[key] = result[key]
        if result.get("shareID"):
            out["shareID"] = "<generated>"
        if result.get("consumedCapacity"):
            out["consumedCapacity"] = _quantities(result["consumedCapacity"])
        results.append(out)
    out_alloc: Obj = {"results": results}
    if devices.get("config"):
        out_alloc["config"] = devices["config"]
    if allocation.get("nodeSelector"):
        out_alloc["nodeSelector"] = allocation["nodeSelector"]
    return out_alloc


def load() -> tuple[str, list[Case]]:
    doc = json.loads(TABLE.read_text())
    return str(doc["source"]), [Case(c["name"], c) for c in doc["cases"]]
