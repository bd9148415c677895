"""Events the scheduler and the claim controller emit for a pod, and the scheduler's messages
(``pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from simulator.nvidia.constants import DEFAULT_CREATED, Obj
from simulator.nvidia.objects import _meta


def _event(
    pod: dict[str, Any],
    reason: str,
    message: str,
    count: int,
    first_timestamp: str,
    last_timestamp: str,
    component: str,
    action: str,
) -> Obj:
    pmeta = pod["metadata"]
    ns = pmeta.get("namespace", "default")
    # Event names are `<object>.<hex>`; derive the hex from the content so it is stable.
    key = f"{reason}/{ns}/{pmeta['name']}/{first_timestamp}"
    name = f"{pmeta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    meta = _meta("Event", name, ns, first_timestamp)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": meta,
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": ns,
            "name": pmeta["name"],
            "uid": pmeta["uid"],
        },
        "type": "Warning",
        "reason": reason,
        "message": message,
        "count": count,
        "firstTimestamp": first_timestamp,
        "lastTimestamp": last_timestamp,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": "",
        "action": action,
        "eventTime": None,
    }


def failed_scheduling_event(
    pod: dict[str, Any],
    message: str,
    count: int = 1,
    first_timestamp: str | None = None,
    last_timestamp: str | None = None,
) -> Obj:
    """Warning `FailedScheduling` from default-scheduler about `pod`."""
    first = first_timestamp or pod["metadata"].get("creationTimestamp") or DEFAULT_CREATED
    return _event(
        pod,
        "FailedScheduling",
        message,
        count,
        first,
        last_timestamp or first,
        "default-scheduler",
        "Scheduling",
    )


def failed_claim_creation_event(
    pod: dict[str, Any],
    pod_claim_name: str,
    error: str,
    count: int = 1,
    first_timestamp: str | None = None,
    last_timestamp: str | None = None,
) -> Obj:
    """Warning `FailedResourceClaimCreation` from the ResourceClaim controller (kube-controller-manager)."""
    first = first_timestamp or pod["metadata"].get("creationTimestamp") or DEFAULT_CREATED
    return _event(
        pod,
        "FailedResourceClaimCreation",
        f"PodResourceClaim {pod_claim_name}: {error}",
        count,
        first,
        last_timestamp or first,
        "resource_claim",
        "",
    )


# ---------------------------------------------------------------------------------------------------------
# Scheduler messages (pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go)
# ---------------------------------------------------------------------------------------------------------

CANNOT_ALLOCATE: Final = "cannot allocate all claims"


def fit_error_message(total_nodes: int, reasons: Mapping[str, int], preemption: bool = True) -> str:
    """`FitError.Error()`: "0/N nodes are available: <n> <reason>, …." plus the PostFilter preemption text."""
    parts = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: kv[0]))
    msg = f"0/{total_nodes} nodes are available: {parts}."
    if preemption:
        msg += (
            f" still not schedulable, preemption: 0/{total_nodes} nodes are available: "
            f"{total_nodes} Preemption is not helpful for scheduling."
        )
    return msg


def cel_runtime_error_message(namespace: str, claim: str, selector_index: int, detail: str) -> str:
    """SchedulerError text for a request selector failing at runtime (``selectorsMatch`` in
    ``dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go``);
    exact CEL detail UNCERTAIN."""
    return (
        f'running "DynamicResources" filter plugin: claim {namespace}/{claim}: '
        f"selector #{selector_index}: CEL runtime error: {detail}"
    )
