"""DRA extended resources: the claim the scheduler builds in memory for a pod's extended resource requests
(``specialClaimInMemName``), so that such a pod is diagnosed like a claim.
"""

from __future__ import annotations

from claims.diagnosis.result import Obj
from claims.fleetstate import FleetState, claim_results
from fleet.quantity import QuantityError, parse_quantity

EXTENDED_CLAIM_NAME = "<extended-resources>"  # the scheduler's in-memory name (specialClaimInMemName)
IMPLICIT_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"


def _class_for_resources(state: FleetState) -> dict[str, str]:
    """Extended resource name -> DeviceClass (``extendedResourceName``; on a clash the newest class, then
    the lower name, as the scheduler's extended resource cache), plus the implicit
    ``deviceclass.resource.kubernetes.io/<class>`` of every class."""
    out: dict[str, str] = {}
    chosen: dict[str, tuple[str, str]] = {}
    for device_class in state.objects["DeviceClass"]:
        meta = device_class.get("metadata") or {}
        name = str(meta.get("name", ""))
        out[IMPLICIT_CLASS_PREFIX + name] = name
        resource = (device_class.get("spec") or {}).get("extendedResourceName")
        if not resource:
            continue
        created = str(meta.get("creationTimestamp") or "")
        best = chosen.get(resource)
        if best is None or created > best[0] or (created == best[0] and name < best[1]):
            chosen[resource] = (created, name)
    out.update({resource: name for resource, (_, name) in chosen.items()})
    return out


def _container_count(container: Obj, resource: str) -> int:
    resources = container.get("resources") or {}
    # The API server defaults an extended resource's request to its limit; a pasted pod may have only that.
    raw = (resources.get("requests") or {}).get(resource, (resources.get("limits") or {}).get(resource))
    if raw is None:
        return 0
    try:
        value = parse_quantity(str(raw)).value
    except QuantityError:
        return 0
    return int(value) if value.denominator == 1 else 0


def _container_request(
    index: int, container: Obj, resource: str, class_name: str, reusable: list[Obj | None]
) -> Obj | None:
    """``createResourceRequestAndMappings``: the request a container adds for ``resource`` (None when the
    requests it may reuse already cover it). Named container-<index>-request-<index of the resource among
    the container's sorted requests>."""
    wanted = _container_count(container, resource)
    if not wanted:
        return None
    covered = 0
    for other in reusable:
        if other is not None:
            covered += int(other["exactly"]["count"])
            if covered >= wanted:
                return None
    resources = container.get("resources") or {}
    names = sorted({*(resources.get("requests") or {}), *(resources.get("limits") or {})})
    return {
        "name": f"container-{index}-request-{names.index(resource)}",
        "exactly": {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": wanted - covered},
    }


def extended_resource_claim(state: FleetState, pod: Obj) -> Obj | None:
    """The claim the scheduler builds for a pod's DRA extended resources (``nvidia.com/gpu: 1`` backed by a
    DeviceClass with that ``extendedResourceName``), or None when there is none or it is already allocated.
    A port of ``createRequestsAndMappings`` (extendeddynamicresources.go). Nodes that offer the resource
    through a device plugin (node allocatable) are not told apart: the diagnosis assumes DRA everywhere."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status_name = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
        "resourceClaimName"
    )
    if status_name:
        existing = state.find("ResourceClaim", str(meta.get("namespace", "")), str(status_name))
        if existing is not None and claim_results(existing):
            return None
    classes = _class_for_resources(state)
    init = list(spec.get("initContainers") or [])
    containers = [*init, *(spec.get("containers") or [])]
    wanted = sorted(
        {
            resource
            for c in containers
            for part in ("requests", "limits")
            for resource in ((c.get("resources") or {}).get(part) or {})
            if resource in classes
        }
    )
    requests: list[Obj] = []
    for resource in wanted:
        long_lived = [
            i for i, c in enumerate(containers) if i >= len(init) or c.get("restartPolicy") == "Always"
        ]
        short_lived = [i for i in range(len(init)) if i not in long_lived]
        per_container: list[Obj | None] = [None] * len(containers)
        for i in long_lived:
            per_container[i] = _container_request(i, containers[i], resource, classes[resource], [])
        biggest: Obj | None = None
        for i in short_lived:
            request = _container_request(i, containers[i], resource, classes[resource], per_container[i:])
            if request is not None and (
                biggest is None or biggest["exactly"]["count"] < request["exactly"]["count"]
            ):
                biggest = request
        requests += [r for r in ([biggest] if biggest else []) + per_container if r is not None]
    if not requests:
        return None
    requests.sort(key=lambda r: str(r["name"]))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": meta.get("namespace", ""), "name": EXTENDED_CLAIM_NAME},
        "spec": {"devices": {"requests": requests}},
    }
