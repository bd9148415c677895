"""ResourceClaims, templates and pods as users and controllers write them, and a claim's allocation status."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from simulator.nvidia.constants import DEFAULT_CREATED, GPU_DRIVER, RESOURCE_API, Obj, name_suffix
from simulator.nvidia.objects import _meta


def exactly_request(
    name: str,
    device_class: str,
    count: int = 1,
    selectors: Sequence[str] = (),
    admin_access: bool = False,
    allocation_mode: str = "ExactCount",
    tolerations: Sequence[dict[str, Any]] | None = None,
    capacity: dict[str, str] | None = None,
) -> Obj:
    """A DeviceRequest with `exactly` (selectors are CEL expressions)."""
    ex: Obj = {"deviceClassName": device_class, "allocationMode": allocation_mode}
    if allocation_mode == "ExactCount":
        ex["count"] = count
    if selectors:
        ex["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if admin_access:
        ex["adminAccess"] = True
    if tolerations:
        ex["tolerations"] = [dict(t) for t in tolerations]
    if capacity:
        ex["capacity"] = {"requests": dict(capacity)}
    return {"name": name, "exactly": ex}


def subrequest(
    name: str,
    device_class: str,
    count: int = 1,
    selectors: Sequence[str] = (),
    allocation_mode: str = "ExactCount",
) -> Obj:
    """One `firstAvailable` entry (no adminAccess on subrequests)."""
    sub: Obj = {"name": name, "deviceClassName": device_class, "allocationMode": allocation_mode}
    if allocation_mode == "ExactCount":
        sub["count"] = count
    if selectors:
        sub["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return sub


def first_available_request(name: str, subrequests: Sequence[dict[str, Any]]) -> Obj:
    return {"name": name, "firstAvailable": [dict(s) for s in subrequests]}


def _claim_spec(
    requests: Sequence[dict[str, Any]],
    constraints: Sequence[dict[str, Any]] | None,
    config: Sequence[dict[str, Any]] | None,
) -> Obj:
    devices: Obj = {"requests": [dict(r) for r in requests]}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    if config:
        devices["config"] = [dict(c) for c in config]
    return {"devices": devices}


def claim_object(
    namespace: str,
    name: str,
    requests: Sequence[dict[str, Any]],
    constraints: Sequence[dict[str, Any]] | None = None,
    uid: str | None = None,
    config: Sequence[dict[str, Any]] | None = None,
    status: dict[str, Any] | None = None,
    owner_pod: dict[str, Any] | None = None,
    pod_claim_name: str | None = None,
    labels: dict[str, str] | None = None,
    created: str | None = None,
) -> Obj:
    """A ResourceClaim. With `owner_pod` it looks template-generated (owner ref + pod-claim-name annotation).

    `status` is typically `allocation_status(...)`; an allocated claim also gets the scheduler's
    `resource.kubernetes.io/delete-protection` finalizer.
    """
    meta = _meta("ResourceClaim", name, namespace, created, uid)
    if labels:
        meta["labels"] = dict(labels)
    if owner_pod is not None:
        pmeta = owner_pod["metadata"]
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pmeta["name"],
                "uid": pmeta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        if pod_claim_name:
            meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": pod_claim_name}
            meta["generateName"] = generated_claim_prefix(pmeta["name"], pod_claim_name)
    obj: Obj = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": _claim_spec(requests, constraints, config),
    }
    if status:
        obj["status"] = dict(status)
        if status.get("allocation"):
            meta["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    return obj


def claim_template(
    namespace: str,
    name: str,
    requests: Sequence[dict[str, Any]],
    constraints: Sequence[dict[str, Any]] | None = None,
    config: Sequence[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    created: str | None = None,
) -> Obj:
    """A ResourceClaimTemplate (spec.spec is a ResourceClaimSpec)."""
    meta = _meta("ResourceClaimTemplate", name, namespace, created)
    if labels:
        meta["labels"] = dict(labels)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {"spec": _claim_spec(requests, constraints, config)},
    }


def generated_claim_prefix(pod: str, pod_claim: str) -> str:
    """GenerateName `<pod>-<podClaimName>-` with both parts cut proportionally when longer than 57 chars."""
    max_len = 57
    if len(pod) + len(pod_claim) > max_len:
        pod_len = max_len * len(pod) // (len(pod) + len(pod_claim))
        claim_len = max_len - pod_len
        pod, pod_claim = pod[:pod_len], pod_claim[:claim_len]
    return f"{pod}-{pod_claim}-"


def generated_claim_name(pod: str, pod_claim: str) -> str:
    """The name the ResourceClaim controller would give the pod's claim (deterministic suffix)."""
    return generated_claim_prefix(pod, pod_claim) + name_suffix("claim", pod, pod_claim)


def from_claim(claim_name: str) -> dict[str, str]:
    """Pod claim source referencing an existing ResourceClaim (use as second tuple item in pod_object)."""
    return {"resourceClaimName": claim_name}


def from_template(template_name: str) -> dict[str, str]:
    return {"resourceClaimTemplateName": template_name}


def scheduled_condition(ts: str) -> Obj:
    return {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts, "lastProbeTime": None}


def unschedulable_condition(message: str, ts: str, reason: str = "Unschedulable") -> Obj:
    """PodScheduled=False, reason "Unschedulable" (rejected) or "SchedulerError" (Filter error, e.g. CEL)."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": ts,
        "lastProbeTime": None,
    }


def pod_object(
    namespace: str,
    name: str,
    claims: Sequence[tuple[str, str | dict[str, str]]],
    node: str | None = None,
    scheduled: dict[str, Any] | None = None,
    claim_statuses: Mapping[str, str] | None = None,
    phase: str | None = None,
    labels: dict[str, str] | None = None,
    uid: str | None = None,
    created: str | None = None,
    image: str = "nvcr.io/nvidia/pytorch:25.08-py3",
    owner: dict[str, Any] | None = None,
) -> Obj:
    """A Pod using DRA claims.

    `claims`: (podClaimName, source); a str source is a ResourceClaimTemplate name, a dict is taken as-is
    (`from_claim("x")` / `from_template("t")`). `claim_statuses` maps podClaimName -> generated claim name
    (pod.status.resourceClaimStatuses); templates without an entry look "claim not created yet".
    `scheduled`: PodScheduled condition (see `unschedulable_condition`); default True when `node` is set.
    `phase` defaults to Running on a node, Pending otherwise.
    """
    ts = created or DEFAULT_CREATED
    meta = _meta("Pod", name, namespace, created, uid)
    meta["labels"] = dict(labels or {})
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    pod_claims = []
    for pod_claim, source in claims:
        src = from_template(source) if isinstance(source, str) else dict(source)
        pod_claims.append({"name": pod_claim, **src})
    spec: Obj = {
        "containers": [
            {
                "name": "main",
                "image": image,
                "resources": {"claims": [{"name": pc} for pc, _ in claims]},
            }
        ],
        "resourceClaims": pod_claims,
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    }
    if node:
        spec["nodeName"] = node
    conditions = []
    if scheduled is not None:
        conditions.append(dict(scheduled))
    elif node:
        conditions.append(scheduled_condition(ts))
    status: Obj = {"phase": phase or ("Running" if node else "Pending"), "qosClass": "BestEffort"}
    if conditions:
        status["conditions"] = conditions
    if claim_statuses:
        status["resourceClaimStatuses"] = [
            {"name": k, "resourceClaimName": v} for k, v in claim_statuses.items()
        ]
    if node and status["phase"] == "Running":
        status["startTime"] = ts
        octets = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
        status["podIP"] = f"172.{16 + octets[0] % 16}.{octets[1]}.{octets[2] % 254 + 1}"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def consumer_ref(pod: dict[str, Any]) -> Obj:
    """A `reservedFor` entry for a pod (core group: apiGroup omitted as the API server does)."""
    return {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


def node_selector_for(node: str) -> Obj:
    """The allocation nodeSelector the scheduler builds for devices from a node-local slice."""
    return {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }


def allocation_status(
    results: Sequence[dict[str, Any]],
    node: str,
    reserved_for: Iterable[dict[str, Any]] = (),
    config: Sequence[dict[str, Any]] | None = None,
) -> Obj:
    """`status` of an allocated claim: results {request, driver, pool, device[, adminAccess]} + nodeSelector.

    Results default driver gpu.nvidia.com and pool = `node`. `reserved_for` takes pods or ready
    `{resource, name, uid}` entries; an empty list leaves the claim allocated but unreserved.
    """
    out_results = []
    for r in results:
        res: Obj = {
            "request": r["request"],
            "driver": r.get("driver", GPU_DRIVER),
            "pool": r.get("pool", node),
            "device": r["device"],
        }
        if r.get("adminAccess"):
            res["adminAccess"] = True
        if r.get("tolerations"):
            res["tolerations"] = list(r["tolerations"])
        out_results.append(res)
    devices: Obj = {"results": out_results}
    if config:
        devices["config"] = list(config)
    status: Obj = {"allocation": {"devices": devices, "nodeSelector": node_selector_for(node)}}
    refs = [consumer_ref(p) if "metadata" in p else dict(p) for p in reserved_for]
    if refs:
        status["reservedFor"] = refs
    return status
