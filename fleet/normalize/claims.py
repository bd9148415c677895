"""ResourceClaims and ResourceClaimTemplates: their requests, the API versions read, claims that did not
come from an API server (pasted, posted to what-if), and their records.
"""

from __future__ import annotations

import copy
import re
from typing import Any, cast

from fleet.normalize.helpers import _count, _describe, _meta, _quantities, _Reader, _selectors
from fleet.normalize.records import AllocationRecord, ClaimRecord, ClaimSpec, RequestRecord, TemplateRecord


def _request(r: _Reader, value: Any, path: str, sub: bool = False) -> RequestRecord:
    req = r.mapping(value, path, required=True)
    name = r.string(req.get("name"), f"{path}.name", required=True, max_len=63)
    # v1 puts the single-device fields under "exactly"; v1beta1 puts them on the request itself.
    body = r.mapping(req.get("exactly"), f"{path}.exactly") if "exactly" in req else req
    alternatives = []
    if not sub:
        for i, alt in enumerate(r.seq(req.get("firstAvailable"), f"{path}.firstAvailable")):
            alternatives.append(_request(r, alt, f"{path}.firstAvailable[{i}]", sub=True))
    capacity = r.mapping(body.get("capacity"), f"{path}.capacity")
    return RequestRecord(
        name=name,
        device_class=r.string(body.get("deviceClassName"), f"{path}.deviceClassName", max_len=253),
        selectors=_selectors(r, body.get("selectors"), f"{path}.selectors"),
        allocation_mode=r.string(body.get("allocationMode"), f"{path}.allocationMode", max_len=32)
        or "ExactCount",
        count=_count(r, body.get("count"), f"{path}.count"),
        admin_access=r.boolean(body.get("adminAccess"), f"{path}.adminAccess"),
        tolerations=[
            r.mapping(t, f"{path}.tolerations[{i}]", required=True)
            for i, t in enumerate(r.seq(body.get("tolerations"), f"{path}.tolerations"))
        ],
        capacity=_quantities(r, capacity.get("requests"), f"{path}.capacity.requests"),
        alternatives=alternatives,
    )


def _claim_spec(r: _Reader, value: Any, path: str) -> ClaimSpec:
    spec = r.mapping(value, path)
    devices = r.mapping(spec.get("devices"), f"{path}.devices")
    requests = [
        _request(r, req, f"{path}.devices.requests[{i}]")
        for i, req in enumerate(r.seq(devices.get("requests"), f"{path}.devices.requests"))
    ]
    constraints = [
        _constraint(r, c, f"{path}.devices.constraints[{i}]")
        for i, c in enumerate(r.seq(devices.get("constraints"), f"{path}.devices.constraints"))
    ]
    for i, config in enumerate(r.seq(devices.get("config"), f"{path}.devices.config")):
        _config(r, config, f"{path}.devices.config[{i}]")
    return ClaimSpec(requests=requests, constraints=constraints)


def _config(r: _Reader, value: Any, path: str) -> None:
    """A DeviceClaimConfiguration, checked for what an allocation's config reads (claims.allocator)."""
    config = r.mapping(value, path, required=True)  # a null list item configures nothing
    for i, request in enumerate(r.seq(config.get("requests"), f"{path}.requests")):
        r.string(request, f"{path}.requests[{i}]", max_len=127)
    r.mapping(config.get("opaque"), f"{path}.opaque")


def _constraint(r: _Reader, value: Any, path: str) -> dict[str, Any]:
    """A DeviceConstraint, kept as given once the fields that lint and diagnosis read are checked."""
    constraint = r.mapping(value, path, required=True)  # a null list item is no constraint
    for i, request in enumerate(r.seq(constraint.get("requests"), f"{path}.requests")):
        r.string(request, f"{path}.requests[{i}]", max_len=127)
    for key in ("matchAttribute", "distinctAttribute"):
        r.string(constraint.get(key), f"{path}.{key}", max_len=253)
    return constraint


# A DNS-1123 label: what the API server accepts as a namespace.
_NAMESPACE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")


MAX_PASTED_DEPTH = 64  # a real claim nests about 10 levels; opaque driver parameters a few more


def _without_nulls(value: Any, r: _Reader) -> Any:
    """A copy of ``value`` without the null entries of its objects. Iterative, not recursive: a pasted
    text may nest as deep as the parser allows, deeper than the recursion limit leaves room for; nesting
    beyond MAX_PASTED_DEPTH is refused (diagnosis copies the claim recursively)."""
    if not isinstance(value, dict | list):
        return value
    top: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any, str, int]] = [(value, top, "", 1)]
    while stack:
        source, target, path, depth = stack.pop()
        if depth > MAX_PASTED_DEPTH:
            raise r.fail(path, f"nested deeper than {MAX_PASTED_DEPTH} levels")
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in items:
            if item is None and isinstance(source, dict):
                continue
            copied = {} if isinstance(item, dict) else [] if isinstance(item, list) else item
            if isinstance(target, dict):
                target[key] = copied
            else:
                target.append(copied)
            if copied is not item:
                where = (
                    f"{path}[{key}]" if isinstance(source, list) else f"{path}.{key}" if path else str(key)
                )
                stack.append((item, copied, where, depth + 1))
    return top


# resource.k8s.io versions whose claims and templates we read. v1beta1 puts the device fields on the request,
# v1beta2 and v1 under "exactly". v1alpha2 is classic DRA (gone in 1.32) and v1alpha3 claims are not served
# by 1.37; the API server accepts neither, so neither is guessed at.
CLAIM_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1")
_V1BETA1_DEVICE_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)


def unsupported_api_version(obj: dict[str, Any]) -> str:
    """Why a claim or template of this ``apiVersion`` cannot be read ("" when it can; no apiVersion is
    read as v1)."""
    version = obj.get("apiVersion")
    if version is None or version in CLAIM_VERSIONS:
        return ""
    if version == "resource.k8s.io/v1alpha2":
        return (
            "resource.k8s.io/v1alpha2 is classic DRA (resource classes, removed in Kubernetes 1.32): "
            f"not supported; rewrite it for {CLAIM_VERSIONS[0]}"
        )
    return f"apiVersion {version!r} is not supported: use one of {', '.join(CLAIM_VERSIONS)}"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def claim_as_v1(obj: dict[str, Any]) -> dict[str, Any]:
    """A ResourceClaim or ResourceClaimTemplate of a supported version (see :func:`unsupported_api_version`)
    in the ``resource.k8s.io/v1`` shape: v1beta1's request-level device fields move under ``exactly``.
    Returns ``obj`` itself when nothing changes."""
    if obj.get("apiVersion") != "resource.k8s.io/v1beta1":
        return obj
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1"
    spec = _dict(out.get("spec"))
    if out.get("kind") == "ResourceClaimTemplate":
        spec = _dict(spec.get("spec"))
    for request in _dict(spec.get("devices")).get("requests") or []:
        if not isinstance(request, dict) or "exactly" in request or request.get("firstAvailable"):
            continue
        exactly = {k: request.pop(k) for k in _V1BETA1_DEVICE_FIELDS if k in request}
        request.pop("firstAvailable", None)
        request["exactly"] = exactly
    return out


def object_as_v1(obj: dict[str, Any]) -> dict[str, Any]:
    """A ``resource.k8s.io/v1beta1`` ResourceSlice (devices wrapped in ``basic``), ResourceClaim or
    ResourceClaimTemplate in the v1 shape; any other object as it is."""
    if obj.get("apiVersion") != "resource.k8s.io/v1beta1":
        return obj
    if obj.get("kind") in CLAIM_KINDS:
        return claim_as_v1(obj)
    if obj.get("kind") != "ResourceSlice":
        return obj
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1"
    spec = _dict(out.get("spec"))
    if isinstance(spec.get("devices"), list):
        spec["devices"] = [
            {"name": d.get("name"), **d["basic"]}
            if isinstance(d, dict) and isinstance(d.get("basic"), dict)
            else d
            for d in spec["devices"]
        ]
    return out


def clean_pasted_claim(obj: Any) -> dict[str, Any]:
    """A ResourceClaim or ResourceClaimTemplate that did not come from an API server (pasted into "Will it
    fit?", posted to ``/api/v1/whatif``), as lint and diagnosis may read it: a copy without null fields
    (the API server reads ``count: null`` as no count at all), checked by :func:`check_claim_object`.
    Raises NormalizeError naming the field."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    cleaned = _without_nulls(obj, _Reader(_describe(obj, kind if isinstance(kind, str) else "object")))
    check_claim_object(cleaned)
    return cast(dict[str, Any], cleaned)  # check_claim_object refuses anything but an object


def check_claim_object(obj: Any) -> ClaimSpec:
    """The spec of a ResourceClaim or ResourceClaimTemplate that did not come from an API server, checked
    for every shape lint and diagnosis read.

    Unlike :func:`normalize`, metadata may be missing or partial: a claim being written has no uid or
    resourceVersion yet. Raises NormalizeError naming the field, e.g. field ``spec.devices.requests[1]``,
    problem "expected an object, got int".
    """
    kind = obj.get("kind") if isinstance(obj, dict) else None
    r = _Reader(_describe(obj, kind if isinstance(kind, str) else "object"))
    if not isinstance(obj, dict):
        raise r.fail("", "expected an object")
    if kind not in CLAIM_KINDS:
        raise r.fail("kind", f"expected one of {', '.join(CLAIM_KINDS)}")
    unsupported = unsupported_api_version(obj)
    if unsupported:
        raise r.fail("apiVersion", unsupported)
    md = r.mapping(obj.get("metadata"), "metadata")
    r.string(md.get("name"), "metadata.name", max_len=253)
    r.string(md.get("uid"), "metadata.uid", max_len=128)
    namespace = r.string(md.get("namespace"), "metadata.namespace", max_len=63)
    if namespace and not _NAMESPACE.match(namespace):
        raise r.fail("metadata.namespace", "not a DNS label (lower case letters, digits and '-')")
    if kind == "ResourceClaimTemplate":
        outer = r.mapping(obj.get("spec"), "spec", required=True)
        inner = r.mapping(outer.get("spec"), "spec.spec", required=True)
        return _some_request(r, _claim_spec(r, inner, "spec.spec"), "spec.spec")
    # A pasted claim may carry the status it had in a cluster: diagnosis counts its allocated devices.
    status = r.mapping(obj.get("status"), "status")
    allocation = r.mapping(status.get("allocation"), "status.allocation")
    devices = r.mapping(allocation.get("devices"), "status.allocation.devices")
    path = "status.allocation.devices.results"
    for i, result in enumerate(r.seq(devices.get("results"), path)):
        r.mapping(result, f"{path}[{i}]")
    spec = r.mapping(obj.get("spec"), "spec", required=True)
    return _some_request(r, _claim_spec(r, spec, "spec"), "spec")


def _some_request(r: _Reader, spec: ClaimSpec, path: str) -> ClaimSpec:
    # The API server takes a claim without requests (it allocates nothing); asking whether one fits is
    # a mistake worth naming, and diagnosis has nothing to explain for it.
    if not spec.requests:
        raise r.fail(f"{path}.devices.requests", "no request: the claim asks for no device")
    return spec


def _node_from_selector(selector: dict[str, Any]) -> str:
    """The node a claim was allocated on, from the scheduler's matchFields metadata.name selector."""
    for term in selector.get("nodeSelectorTerms") or []:
        for expr in (term or {}).get("matchFields") or []:
            values = expr.get("values") or []
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return ""


def normalize_claim(obj: Any) -> ClaimRecord:
    meta, r = _meta(obj, "ResourceClaim", namespaced=True)
    spec = _claim_spec(r, obj.get("spec"), "spec")
    status = r.mapping(obj.get("status"), "status")
    allocation = r.mapping(status.get("allocation"), "status.allocation")
    results = r.seq(r.mapping(allocation.get("devices"), "status.allocation.devices").get("results"),
                    "status.allocation.devices.results")  # fmt: skip
    allocations = []
    for i, res in enumerate(results):
        path = f"status.allocation.devices.results[{i}]"
        res = r.mapping(res, path)
        allocations.append(
            AllocationRecord(
                request=r.string(res.get("request"), f"{path}.request", required=True, max_len=127),
                driver=r.string(res.get("driver"), f"{path}.driver", required=True, max_len=63),
                pool=r.string(res.get("pool"), f"{path}.pool", required=True, max_len=253),
                device=r.string(res.get("device"), f"{path}.device", required=True, max_len=63),
                admin_access=r.boolean(res.get("adminAccess"), f"{path}.adminAccess"),
                share_id=r.string(res.get("shareID"), f"{path}.shareID", max_len=64),
                consumed_capacity=r.string_map(res.get("consumedCapacity"), f"{path}.consumedCapacity"),
            )
        )
    reserved = []
    for i, ref in enumerate(r.seq(status.get("reservedFor"), "status.reservedFor")):
        ref = r.mapping(ref, f"status.reservedFor[{i}]")
        reserved.append(
            {
                "resource": r.string(ref.get("resource"), f"status.reservedFor[{i}].resource"),
                "name": r.string(ref.get("name"), f"status.reservedFor[{i}].name"),
                "uid": r.string(ref.get("uid"), f"status.reservedFor[{i}].uid"),
            }
        )
    is_allocated = bool(allocation)
    if not is_allocated:
        state = "pending"
    elif meta.deleted_at is not None:
        state = "deallocating"
    elif reserved:
        state = "reserved"
    else:
        state = "allocated"
    owner_uid = owner_name = ""
    for ref in r.seq(meta.raw["metadata"].get("ownerReferences"), "metadata.ownerReferences"):
        if isinstance(ref, dict) and ref.get("kind") == "Pod" and ref.get("controller"):
            owner_uid, owner_name = str(ref.get("uid", "")), str(ref.get("name", ""))
    annotations = r.string_map(meta.raw["metadata"].get("annotations"), "metadata.annotations")
    return ClaimRecord(
        meta=meta,
        spec=spec,
        state=state,
        allocations=allocations,
        reserved_for=reserved,
        node_name=_node_from_selector(
            r.mapping(allocation.get("nodeSelector"), "status.allocation.nodeSelector")
        ),
        owner_pod_uid=owner_uid[:128],
        owner_pod_name=owner_name[:253],
        pod_claim_name=annotations.get("resource.kubernetes.io/pod-claim-name", "")[:253],
        allocated_at=r.time(allocation.get("allocationTimestamp"), "status.allocation.allocationTimestamp"),
    )


def normalize_template(obj: Any) -> TemplateRecord:
    meta, r = _meta(obj, "ResourceClaimTemplate", namespaced=True)
    outer = r.mapping(obj.get("spec"), "spec")
    return TemplateRecord(meta=meta, spec=_claim_spec(r, outer.get("spec"), "spec.spec"))
