"""Binding conditions (KEP-5007, gate DRADeviceBindingConditions, beta in 1.37): a pod whose claims are
allocated waits in the scheduler's PreBind until every ``bindingConditions`` type of each allocated device
is True in the claim's ``status.devices`` (written by the device's binding controller). A true
``bindingFailureConditions`` type, or ``DynamicResourcesBindingTimeoutDefault`` (600 s after the
allocation) without them, makes the scheduler free the allocation and try again
(``isClaimReadyForBinding`` in pkg/scheduler/framework/plugins/dynamicresources, v1.37.2).
"""

from __future__ import annotations

from claims.diagnosis.result import Obj
from claims.fleetstate import claim_results, klog

BINDING_TIMEOUT_SECONDS = 600


def _device_conditions(claim: Obj, result: Obj) -> dict[str, str]:
    """Condition type -> status of the claim's ``status.devices`` entry for ``result`` (same driver, pool,
    device and shareID, as ``getAllocatedDeviceStatus``)."""
    status = claim.get("status")
    for entry in _list(status.get("devices") if isinstance(status, dict) else None):
        if not isinstance(entry, dict):
            continue
        if all(entry.get(k) == result.get(k) for k in ("driver", "pool", "device", "shareID")):
            return {
                str(c.get("type")): str(c.get("status"))
                for c in _list(entry.get("conditions"))
                if isinstance(c, dict)
            }
    return {}


def _list(value: object) -> list[object]:
    """A list field as stored, or nothing: what the API server accepted may still be odd in a snapshot or
    a what-if input, and one odd field must not stop a diagnosis."""
    return value if isinstance(value, list) else []


def binding_waits(claim: Obj) -> list[str]:
    """What the allocated ``claim``'s devices with binding conditions still wait for, in words (empty when
    nothing: no such device, or every condition true)."""
    out = []
    for result in claim_results(claim):
        if not isinstance(result, dict):
            continue
        needed = [str(c) for c in _list(result.get("bindingConditions"))]
        if not needed:
            continue
        conditions = _device_conditions(claim, result)
        device = f"{result.get('driver')}/{result.get('pool')}/{result.get('device')}"
        failed = [
            str(c) for c in _list(result.get("bindingFailureConditions")) if conditions.get(str(c)) == "True"
        ]
        missing = [c for c in needed if conditions.get(c) != "True"]
        if failed:
            out.append(
                f"device {device} of {klog(claim)} reports {', '.join(failed)}: the scheduler frees the "
                "allocation and tries again"
            )
        elif missing:
            out.append(f"device {device} of {klog(claim)} waits for {', '.join(missing)} to be True")
    return out


def binding_suggestion(waits: list[str]) -> list[str]:
    if not waits:
        return []
    return [
        "The devices' binding controller (the driver) sets these conditions in the claim's status.devices; "
        f"without them the scheduler gives up {BINDING_TIMEOUT_SECONDS // 60} minutes after the allocation. "
        "Check that controller, and the pod's BindingConditionsPending events."
    ]
