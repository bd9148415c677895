"""Kubernetes object dicts -> typed records. Pure functions: no ORM, no I/O.

``resource.k8s.io/v1`` and the older ``v1beta1`` shapes (a ``basic`` device wrapper, request fields without
``exactly``) map to the same records. Unknown fields are ignored. A malformed object raises
:class:`NormalizeError` naming the object and the field; callers log it and go on with the batch.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, cast

from fleet.quantity import QuantityError, parse_quantity, quantity_bytes

KINDS = ("DeviceClass", "Node", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "Pod", "Event")
NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
#: Event reasons kept: the ones that explain why a claim or a pod is stuck.
EVENT_REASONS = frozenset(
    {
        "FailedScheduling",
        "FailedResourceClaimCreation",
        "FailedPrepareDynamicResources",
        "FailedUnprepareDynamicResources",
        "BindingConditionsPending",
        "Scheduled",
        "Preempted",
        "TaintManagerEviction",
    }
)
GPU_EXTENDED_RESOURCES = ("nvidia.com/gpu",)
MAX_RESOURCE_VERSION = 2**128 - 1


class NormalizeError(ValueError):
    """An object we cannot read. ``obj`` names it (kind namespace/name) and ``field`` the culprit."""

    def __init__(self, obj: str, field_path: str, problem: str) -> None:
        super().__init__(f"{obj}: field {field_path}: {problem}")
        self.obj = obj
        self.field = field_path
        self.problem = problem


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Meta:
    """What every stored Kubernetes object has."""

    kind: str
    uid: str
    namespace: str
    name: str
    resource_version: int
    created_at: datetime | None
    deleted_at: datetime | None
    labels: dict[str, str]
    raw: dict[str, Any]

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"


@dataclass(frozen=True, slots=True)
class DeviceClassRecord:
    meta: Meta
    selectors: list[str]
    extended_resource_name: str


@dataclass(frozen=True, slots=True)
class NodeRecord:
    meta: Meta
    ready: bool
    unschedulable: bool
    gpu_product: str
    clique: str


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One device of a ResourceSlice, with the fields the dashboard groups and filters by."""

    name: str
    kind: str  # gpu / mig / vfio / channel / other
    model: str  # model family
    product_name: str
    uuid: str
    parent_uuid: str
    gpu_uuid: str  # the physical GPU: its own uuid, or the parent's for MIG
    gpu_minor: int | None
    mig_profile: str
    compute_slices: int  # N of a MIG "Ng" profile; 7 for a full GPU; 0 otherwise
    memory_bytes: int | None
    taints: list[dict[str, Any]]
    counters_consumed: list[dict[str, Any]]
    attributes: dict[str, Any]
    capacity: dict[str, Any]
    node_name: str  # the slice's node, or the device's own with perDeviceNodeSelection


@dataclass(frozen=True, slots=True)
class SliceRecord:
    meta: Meta
    driver: str
    pool: str
    pool_generation: int
    pool_slice_count: int
    node_name: str
    all_nodes: bool
    per_device_node_selection: bool
    shared_counters: list[dict[str, Any]]
    devices: list[DeviceRecord]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A claim request in compact form; ``alternatives`` holds firstAvailable subrequests in order."""

    name: str
    device_class: str
    selectors: list[str]
    allocation_mode: str
    count: int
    admin_access: bool
    tolerations: list[dict[str, Any]]
    capacity: dict[str, str]
    alternatives: list[RequestRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "deviceClassName": self.device_class,
            "selectors": self.selectors,
            "allocationMode": self.allocation_mode,
            "count": self.count,
        }
        if self.admin_access:
            data["adminAccess"] = True
        if self.tolerations:
            data["tolerations"] = self.tolerations
        if self.capacity:
            data["capacity"] = self.capacity
        if self.alternatives:
            data["firstAvailable"] = [alt.as_dict() for alt in self.alternatives]
        return data


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool
    share_id: str
    consumed_capacity: dict[str, str]


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    requests: list[RequestRecord]
    constraints: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    meta: Meta
    spec: ClaimSpec
    state: str  # pending / allocated / reserved / deallocating
    allocations: list[AllocationRecord]
    reserved_for: list[dict[str, str]]
    node_name: str
    owner_pod_uid: str
    owner_pod_name: str
    pod_claim_name: str
    allocated_at: datetime | None


@dataclass(frozen=True, slots=True)
class TemplateRecord:
    meta: Meta
    spec: ClaimSpec


@dataclass(frozen=True, slots=True)
class PodRecord:
    meta: Meta
    phase: str
    node_name: str
    scheduled_status: str
    scheduled_reason: str
    scheduled_message: str
    scheduled_at: datetime | None
    claim_refs: list[dict[str, str]]  # spec.resourceClaims
    claim_statuses: list[dict[str, str]]  # status.resourceClaimStatuses
    gpu_requests: int  # GPU extended resources asked for

    def claim_names(self) -> set[str]:
        """The names of the ResourceClaims this pod uses (see ``pod_claim_names``)."""
        return pod_claim_names(self.claim_refs, self.claim_statuses)[0]


@dataclass(frozen=True, slots=True)
class EventRecord:
    meta: Meta
    reason: str
    type: str
    message: str
    involved_kind: str
    involved_namespace: str
    involved_name: str
    involved_uid: str
    count: int
    first_at: datetime | None
    last_at: datetime | None


Record = DeviceClassRecord | NodeRecord | SliceRecord | ClaimRecord | TemplateRecord | PodRecord | EventRecord


# --------------------------------------------------------------------------------------------- helpers


class _Reader:
    """Typed access to nested fields that raises NormalizeError with the field's path."""

    def __init__(self, obj_name: str) -> None:
        self.obj = obj_name

    def fail(self, path: str, problem: str) -> NormalizeError:
        return NormalizeError(self.obj, path, problem)

    def mapping(self, value: Any, path: str, required: bool = False) -> dict[str, Any]:
        if value is None:
            if required:
                raise self.fail(path, "missing")
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, got {type(value).__name__}")
        return value

    def seq(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list, got {type(value).__name__}")
        return value

    def string(self, value: Any, path: str, required: bool = False, max_len: int = 1024) -> str:
        if value is None or value == "":
            if required:
                raise self.fail(path, "missing")
            return ""
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, got {type(value).__name__}")
        if len(value) > max_len:
            raise self.fail(path, f"longer than {max_len} characters")
        return value

    def integer(self, value: Any, path: str, default: int = 0, minimum: int | None = None) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, got {type(value).__name__}")
        if minimum is not None and value < minimum:
            raise self.fail(path, f"must be >= {minimum}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(path, f"expected a boolean, got {type(value).__name__}")
        return value

    def time(self, value: Any, path: str) -> datetime | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise self.fail(path, f"expected an RFC 3339 time, got {type(value).__name__}")
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise self.fail(path, f"not an RFC 3339 time: {value[:40]!r}") from None
        if parsed.tzinfo is None:
            raise self.fail(path, "time without a time zone")
        return parsed

    def string_map(self, value: Any, path: str) -> dict[str, str]:
        data = self.mapping(value, path)
        for key, item in data.items():
            if not isinstance(item, str):
                raise self.fail(f"{path}.{key}", "expected a string")
        return data


def _describe(obj: Any, kind: str) -> str:
    """A name for error messages, even for objects too broken to read."""
    if not isinstance(obj, dict):
        return f"{kind} <not an object>"
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return f"{kind} <no metadata>"
    ns, name = meta.get("namespace"), meta.get("name")
    name = name if isinstance(name, str) else "<unnamed>"
    return f"{kind} {ns}/{name}" if isinstance(ns, str) and ns else f"{kind} {name}"


def parse_resource_version(value: Any, obj: str = "object") -> int:
    """resourceVersions are opaque strings to clients, but integers in practice (and comparable from 1.35)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isdigit() and len(value) <= 39:
        number = int(value)
    else:
        raise NormalizeError(
            obj, "metadata.resourceVersion", f"expected a decimal integer, got {value!r:.60}"
        )
    if number > MAX_RESOURCE_VERSION:
        raise NormalizeError(obj, "metadata.resourceVersion", "larger than 128 bits")
    return number


_STRIP_METADATA = ("managedFields",)
# What the API server accepts for the names of every kind we watch (apimachinery's IsDNS1123Subdomain and
# IsDNS1123Label): an object named otherwise never came from a real cluster (a hand-edited snapshot, a
# broken source), and such a name would break the links of every page that lists it.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAMESPACE_NAME = re.compile(_DNS_LABEL)


def _meta(obj: Any, kind: str, namespaced: bool) -> tuple[Meta, _Reader]:
    name = _describe(obj, kind)
    r = _Reader(name)
    if not isinstance(obj, dict):
        raise r.fail("", "expected an object")
    md = r.mapping(obj.get("metadata"), "metadata", required=True)
    uid = r.string(md.get("uid"), "metadata.uid", required=True, max_len=128)
    obj_name = r.string(md.get("name"), "metadata.name", required=True, max_len=253)
    if not _SUBDOMAIN_NAME.fullmatch(obj_name):
        raise r.fail("metadata.name", f"{obj_name[:80]!r} is not a valid name (lowercase DNS subdomain)")
    namespace = r.string(md.get("namespace"), "metadata.namespace", required=namespaced, max_len=63)
    if namespaced and not _NAMESPACE_NAME.fullmatch(namespace):
        raise r.fail("metadata.namespace", f"{namespace[:80]!r} is not a valid namespace (DNS label)")
    # managedFields are large and say nothing we show; drop them from the stored copy.
    raw = dict(obj)
    raw["metadata"] = {k: v for k, v in md.items() if k not in _STRIP_METADATA}
    raw.setdefault("kind", kind)
    meta = Meta(
        kind=kind,
        uid=uid,
        namespace=namespace if namespaced else "",
        name=obj_name,
        resource_version=parse_resource_version(md.get("resourceVersion"), name),
        created_at=r.time(md.get("creationTimestamp"), "metadata.creationTimestamp"),
        deleted_at=r.time(md.get("deletionTimestamp"), "metadata.deletionTimestamp"),
        labels=r.string_map(md.get("labels"), "metadata.labels"),
        raw=raw,
    )
    return meta, r


# --------------------------------------------------------------------------------------------- GPUs

_FAMILIES = [
    (re.compile(r"\bGB300\b"), "GB300"),
    (re.compile(r"\bGB200\b"), "GB200"),
    (re.compile(r"\bB300\b"), "B300"),
    (re.compile(r"\bB200\b"), "B200"),
    (re.compile(r"\bH200\b"), "H200"),
    (re.compile(r"\bH100\b"), "H100"),
    (re.compile(r"\bA100\b"), "A100"),
]
MODEL_FAMILIES = (*(name for _, name in _FAMILIES), "other")


def model_family(product_name: str) -> str:
    """The model family of an NVML product name: "NVIDIA H100 80GB HBM3" -> "H100".

    Word boundaries keep Grace-Hopper "GH200" out of "H200": a superchip with its own memory is not
    interchangeable with an H200 for scheduling, so it is "other" until it gets a family of its own.
    """
    # A fleet has a handful of product names, repeated on 100,000 devices; odd long ones are not kept.
    return _cached_family(product_name) if len(product_name) <= CACHED_LENGTH else _family(product_name)


CACHED_LENGTH = 256  # longest text whose parse is cached (a published text could be huge)


def _family(product_name: str) -> str:
    for pattern, family in _FAMILIES:
        if pattern.search(product_name.upper()):
            return family
    return "other"


_cached_family = lru_cache(maxsize=1024)(_family)

_MIG_PROFILE = re.compile(r"^(\d+)g\.\d+gb")
_GPU_MINOR = re.compile(r"^gpu-(\d+)(?:-|$)")
FULL_GPU_SLICES = 7


def mig_compute_slices(profile: str) -> int:
    """The N of a MIG "Ng.Mgb[+attr]" profile; 0 when the text is not a MIG profile."""
    match = _MIG_PROFILE.match(profile)
    return int(match.group(1)) if match else 0


_ATTRIBUTE_TYPES = ("string", "version", "int", "bool", "strings", "versions", "ints", "bools")
_ATTRIBUTE_TYPE_SET = frozenset(_ATTRIBUTE_TYPES)
_MISSING = object()


def _attribute_value(r: _Reader, value: Any, path: str) -> Any:
    """A DeviceAttribute holds exactly one typed value (string/int/bool/version, or list forms)."""
    data = r.mapping(value, path, required=True)
    for key in _ATTRIBUTE_TYPES:
        if key in data:
            return data[key]
    raise r.fail(path, "attribute without a value")


def _attributes(r: _Reader, value: Any, path: str) -> dict[str, Any]:
    """A device's attributes as plain values. The usual shape (one typed value per attribute) takes a
    fast path: this runs for every attribute of every device, a million times for a large fleet."""
    out: dict[str, Any] = {}
    for key, item in r.mapping(value, path).items():
        if type(item) is dict and len(item) == 1:
            ((typ, plain),) = item.items()
            if typ in _ATTRIBUTE_TYPE_SET:
                out[key] = plain
                continue
        out[key] = _attribute_value(r, item, f"{path}.{key}")
    return out


def _memory_bytes(quantity: str | int) -> int | None:
    # A fleet publishes a few distinct memory sizes, on 100,000 devices.
    if isinstance(quantity, str) and len(quantity) > CACHED_LENGTH:
        return quantity_bytes(quantity)
    return _cached_quantity_bytes(quantity)


_cached_quantity_bytes = lru_cache(maxsize=4096, typed=True)(quantity_bytes)  # typed: True is not 1


def _device(
    r: _Reader, driver: str, slice_node: str, raw_device: Any, path: str
) -> tuple[DeviceRecord, dict[str, Any]]:
    dev = r.mapping(raw_device, path, required=True)
    # v1beta1 wraps the device's fields in "basic".
    body = r.mapping(dev.get("basic"), f"{path}.basic") if "basic" in dev else dev
    name = r.string(dev.get("name"), f"{path}.name", required=True, max_len=63)
    attributes = _attributes(r, body.get("attributes"), f"{path}.attributes")
    capacity: dict[str, Any] = {}
    for key, value in r.mapping(body.get("capacity"), f"{path}.capacity").items():
        if isinstance(value, dict):  # v1: {"value": "80Gi", ...}
            capacity[key] = value.get("value")
        elif isinstance(value, str):  # v1beta1 before DeviceCapacity: a bare quantity
            capacity[key] = value
        else:
            raise r.fail(f"{path}.capacity.{key}", "expected a quantity")

    def attr(short: str) -> str:
        value = attributes.get(short, _MISSING)
        if value is _MISSING:
            value = attributes.get(f"{driver}/{short}", "")
        return value if isinstance(value, str) else str(value)

    kind = attr("type") or "other"
    kind = kind if kind in ("gpu", "mig", "vfio", "channel") else "other"
    product = attr("productName")
    profile = attr("profile") if kind == "mig" else ""
    uuid = attr("uuid")
    parent = attr("parentUUID")
    minor_match = _GPU_MINOR.match(name)
    memory = capacity.get("memory") if kind in ("gpu", "mig") else capacity.get("addressableMemory")
    taints = [
        r.mapping(t, f"{path}.taints[{i}]") for i, t in enumerate(r.seq(body.get("taints"), f"{path}.taints"))
    ]
    counters = r.seq(body.get("consumesCounters"), f"{path}.consumesCounters")
    node = r.string(body.get("nodeName"), f"{path}.nodeName") or slice_node
    record = DeviceRecord(
        name=name,
        kind=kind,
        model=model_family(product) if kind in ("gpu", "mig", "vfio") else "other",
        product_name=product[:128],
        uuid=uuid[:128],
        parent_uuid=parent[:128],
        gpu_uuid=(parent if kind == "mig" else uuid)[:128] if kind in ("gpu", "mig", "vfio") else "",
        gpu_minor=int(minor_match.group(1)) if minor_match else None,
        mig_profile=profile[:64],
        compute_slices=mig_compute_slices(profile)
        if kind == "mig"
        else (FULL_GPU_SLICES if kind == "gpu" else 0),
        memory_bytes=_memory_bytes(memory) if isinstance(memory, str | int) else None,
        taints=taints,
        counters_consumed=[r.mapping(c, f"{path}.consumesCounters") for c in counters],
        attributes=attributes,
        capacity=capacity,
        node_name=node,
    )
    return record, dev


# --------------------------------------------------------------------------------------------- kinds


def normalize_device_class(obj: Any) -> DeviceClassRecord:
    meta, r = _meta(obj, "DeviceClass", namespaced=False)
    spec = r.mapping(obj.get("spec"), "spec")
    return DeviceClassRecord(
        meta=meta,
        selectors=_selectors(r, spec.get("selectors"), "spec.selectors"),
        extended_resource_name=r.string(spec.get("extendedResourceName"), "spec.extendedResourceName"),
    )


def _selectors(r: _Reader, value: Any, path: str) -> list[str]:
    out = []
    for i, sel in enumerate(r.seq(value, path)):
        sel = r.mapping(sel, f"{path}[{i}]")
        cel = r.mapping(sel.get("cel"), f"{path}[{i}].cel")
        out.append(r.string(cel.get("expression"), f"{path}[{i}].cel.expression", max_len=10240))
    return out


def normalize_node(obj: Any) -> NodeRecord:
    meta, r = _meta(obj, "Node", namespaced=False)
    spec = r.mapping(obj.get("spec"), "spec")
    status = r.mapping(obj.get("status"), "status")
    ready = False
    for i, cond in enumerate(r.seq(status.get("conditions"), "status.conditions")):
        cond = r.mapping(cond, f"status.conditions[{i}]")
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
    return NodeRecord(
        meta=meta,
        ready=ready,
        unschedulable=r.boolean(spec.get("unschedulable"), "spec.unschedulable"),
        gpu_product=meta.labels.get("nvidia.com/gpu.product", "")[:128],
        clique=meta.labels.get("nvidia.com/gpu.clique", "")[:128],
    )


def normalize_slice(obj: Any) -> SliceRecord:
    meta, r = _meta(obj, "ResourceSlice", namespaced=False)
    spec = r.mapping(obj.get("spec"), "spec", required=True)
    driver = r.string(spec.get("driver"), "spec.driver", required=True, max_len=63)
    pool = r.mapping(spec.get("pool"), "spec.pool", required=True)
    node = r.string(spec.get("nodeName"), "spec.nodeName", max_len=253)
    devices = []
    seen: set[str] = set()
    for i, raw_device in enumerate(r.seq(spec.get("devices"), "spec.devices")):
        device, _ = _device(r, driver, node, raw_device, f"spec.devices[{i}]")
        if device.name in seen:
            raise r.fail(f"spec.devices[{i}].name", f"duplicate device name {device.name!r}")
        seen.add(device.name)
        devices.append(device)
    return SliceRecord(
        meta=meta,
        driver=driver,
        pool=r.string(pool.get("name"), "spec.pool.name", required=True, max_len=253),
        pool_generation=r.integer(pool.get("generation"), "spec.pool.generation", minimum=0),
        pool_slice_count=r.integer(
            pool.get("resourceSliceCount"), "spec.pool.resourceSliceCount", 1, minimum=1
        ),
        node_name=node,
        all_nodes=r.boolean(spec.get("allNodes"), "spec.allNodes"),
        per_device_node_selection=r.boolean(
            spec.get("perDeviceNodeSelection"), "spec.perDeviceNodeSelection"
        ),
        shared_counters=[
            r.mapping(c, f"spec.sharedCounters[{i}]")
            for i, c in enumerate(r.seq(spec.get("sharedCounters"), "spec.sharedCounters"))
        ],
        devices=devices,
    )


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


def _quantities(r: _Reader, value: Any, path: str) -> dict[str, str]:
    """A map of Kubernetes quantities, as strings. YAML written by hand may give a plain number
    (``memory: 40``), which the API server accepts too."""
    out = {}
    for key, item in r.mapping(value, path).items():
        if isinstance(item, int) and not isinstance(item, bool) and -INT64_MAX - 1 <= item <= INT64_MAX:
            item = str(item)
        if not isinstance(item, str):
            raise r.fail(f"{path}.{key}", "expected a quantity such as 40Gi")
        try:
            parse_quantity(item)
        except QuantityError:
            raise r.fail(f"{path}.{key}", f"not a quantity: {item[:40]!r}") from None
        out[str(key)] = item
    return out


INT64_MAX = 2**63 - 1


def _count(r: _Reader, value: Any, path: str) -> int:
    count = r.integer(value, path, default=1, minimum=0)
    if count > INT64_MAX:  # an int64 for the API server
        raise r.fail(path, f"must be <= {INT64_MAX}")
    return count


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
    return ClaimSpec(requests=requests, constraints=constraints)


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


def pod_uses_gpus(obj: dict[str, Any]) -> bool:
    """Pods worth storing: they use resource claims or ask for a GPU extended resource."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(spec, dict):
        return False
    if spec.get("resourceClaims"):
        return True
    return _gpu_requests(spec) > 0


def pod_claim_names(
    claim_refs: Sequence[Mapping[str, Any]], claim_statuses: Sequence[Mapping[str, Any]]
) -> tuple[set[str], bool]:
    """(names of the claims a pod uses, whether some reference has no claim yet).

    A reference names its claim directly (``resourceClaimName``) or through a template, whose generated
    claim's name the pod's ``status.resourceClaimStatuses`` gives once the claim controller made it.
    """
    statuses = {s.get("name"): s.get("resourceClaimName") for s in claim_statuses or []}
    names: set[str] = set()
    missing = False
    for ref in claim_refs or []:
        name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
        if name:
            names.add(str(name))
        else:
            missing = True
    return names, missing


def _gpu_requests(spec: dict[str, Any]) -> int:
    """GPU extended resources the pod's containers ask for; odd shapes count as none (never raise)."""
    total = 0
    containers = [c for key in ("containers", "initContainers") for c in _list(spec.get(key))]
    for container in containers:
        resources = container.get("resources") if isinstance(container, dict) else None
        if not isinstance(resources, dict):
            continue
        limits, requests = resources.get("limits"), resources.get("requests")
        limits = limits if isinstance(limits, dict) else {}
        requests = requests if isinstance(requests, dict) else {}
        for name in GPU_EXTENDED_RESOURCES:
            value = requests.get(name, limits.get(name))
            if isinstance(value, int | str) and not isinstance(value, bool) and str(value).isdigit():
                total += int(value)
    return total


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def normalize_pod(obj: Any) -> PodRecord:
    meta, r = _meta(obj, "Pod", namespaced=True)
    spec = r.mapping(obj.get("spec"), "spec")
    status = r.mapping(obj.get("status"), "status")
    cond: dict[str, Any] = {}
    for i, c in enumerate(r.seq(status.get("conditions"), "status.conditions")):
        c = r.mapping(c, f"status.conditions[{i}]")
        if c.get("type") == "PodScheduled":
            cond = c
    refs = []
    for i, ref in enumerate(r.seq(spec.get("resourceClaims"), "spec.resourceClaims")):
        path = f"spec.resourceClaims[{i}]"
        ref = r.mapping(ref, path)
        refs.append(
            {
                "name": r.string(ref.get("name"), f"{path}.name", required=True),
                "resourceClaimName": r.string(ref.get("resourceClaimName"), f"{path}.resourceClaimName"),
                "resourceClaimTemplateName": r.string(
                    ref.get("resourceClaimTemplateName"), f"{path}.resourceClaimTemplateName"
                ),
            }
        )
    statuses = []
    for i, st in enumerate(r.seq(status.get("resourceClaimStatuses"), "status.resourceClaimStatuses")):
        path = f"status.resourceClaimStatuses[{i}]"
        st = r.mapping(st, path)
        statuses.append(
            {
                "name": r.string(st.get("name"), f"{path}.name", required=True),
                "resourceClaimName": r.string(st.get("resourceClaimName"), f"{path}.resourceClaimName"),
            }
        )
    return PodRecord(
        meta=meta,
        phase=r.string(status.get("phase"), "status.phase", max_len=32),
        node_name=r.string(spec.get("nodeName"), "spec.nodeName", max_len=253),
        scheduled_status=r.string(cond.get("status"), "status.conditions.PodScheduled.status", max_len=16),
        scheduled_reason=r.string(cond.get("reason"), "status.conditions.PodScheduled.reason", max_len=128),
        scheduled_message=r.string(
            cond.get("message"), "status.conditions.PodScheduled.message", max_len=32768
        ),
        scheduled_at=r.time(
            cond.get("lastTransitionTime"), "status.conditions.PodScheduled.lastTransitionTime"
        ),
        claim_refs=refs,
        claim_statuses=statuses,
        gpu_requests=_gpu_requests(spec),
    )


def event_is_relevant(obj: dict[str, Any]) -> bool:
    return isinstance(obj, dict) and obj.get("reason") in EVENT_REASONS


def normalize_event(obj: Any) -> EventRecord:
    meta, r = _meta(obj, "Event", namespaced=True)
    involved = r.mapping(obj.get("involvedObject") or obj.get("regarding"), "involvedObject")
    series = r.mapping(obj.get("series"), "series")
    count = r.integer(obj.get("count"), "count", default=0, minimum=0) or r.integer(
        series.get("count"), "series.count", default=1, minimum=0
    )
    first = r.time(obj.get("firstTimestamp"), "firstTimestamp") or r.time(obj.get("eventTime"), "eventTime")
    last = (
        r.time(obj.get("lastTimestamp"), "lastTimestamp")
        or r.time(series.get("lastObservedTime"), "series.lastObservedTime")
        or first
    )
    return EventRecord(
        meta=meta,
        reason=r.string(obj.get("reason"), "reason", max_len=128),
        type=r.string(obj.get("type"), "type", max_len=32),
        message=r.string(obj.get("message") or obj.get("note"), "message", max_len=32768),
        involved_kind=r.string(involved.get("kind"), "involvedObject.kind", max_len=64),
        involved_namespace=r.string(involved.get("namespace"), "involvedObject.namespace", max_len=63),
        involved_name=r.string(involved.get("name"), "involvedObject.name", max_len=253),
        involved_uid=r.string(involved.get("uid"), "involvedObject.uid", max_len=128),
        count=count,
        first_at=first,
        last_at=last,
    )


NORMALIZERS: Mapping[str, Callable[[Any], Record]] = {
    "DeviceClass": normalize_device_class,
    "Node": normalize_node,
    "ResourceSlice": normalize_slice,
    "ResourceClaim": normalize_claim,
    "ResourceClaimTemplate": normalize_template,
    "Pod": normalize_pod,
    "Event": normalize_event,
}


def normalize(kind: str, obj: Any) -> Record:
    """Normalize one object of ``kind``; every failure is a NormalizeError naming the object and field."""
    try:
        fn = NORMALIZERS[kind]
    except KeyError:
        raise NormalizeError(_describe(obj, kind), "kind", f"unsupported kind {kind!r}") from None
    try:
        return fn(obj)
    except NormalizeError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        # A shape we did not foresee: still one error type, naming the object.
        raise NormalizeError(_describe(obj, kind), "?", f"{type(exc).__name__}: {exc}") from exc


def is_stored(kind: str, obj: dict[str, Any]) -> bool:
    """Filters applied before normalizing: only GPU pods and relevant events are kept."""
    if kind == "Pod":
        return pod_uses_gpus(obj)
    if kind == "Event":
        return event_is_relevant(obj)
    return True
