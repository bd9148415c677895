"""The per-kind normalize functions (device classes, nodes, slices, pods, events, DeviceTaintRules) and
their dispatch, :func:`normalize`. Claims and templates are in ``claims``, GPU devices in ``gpus``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fleet.normalize.claims import normalize_claim, normalize_template
from fleet.normalize.gpus import _device
from fleet.normalize.helpers import NormalizeError, _describe, _meta, _selectors
from fleet.normalize.records import (
    DeviceClassRecord,
    DeviceTaintRuleRecord,
    EventRecord,
    NodeRecord,
    PodRecord,
    Record,
    SliceRecord,
)
from fleet.taint_rules import TAINT_FIELDS

KINDS = (
    "DeviceClass",
    "Node",
    "ResourceSlice",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "Pod",
    "Event",
    "DeviceTaintRule",
)


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


def normalize_device_class(obj: Any) -> DeviceClassRecord:
    meta, r = _meta(obj, "DeviceClass", namespaced=False)
    spec = r.mapping(obj.get("spec"), "spec")
    return DeviceClassRecord(
        meta=meta,
        selectors=_selectors(r, spec.get("selectors"), "spec.selectors"),
        extended_resource_name=r.string(spec.get("extendedResourceName"), "spec.extendedResourceName"),
    )


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


def normalize_device_taint_rule(obj: Any) -> DeviceTaintRuleRecord:
    meta, r = _meta(obj, "DeviceTaintRule", namespaced=False)
    spec = r.mapping(obj.get("spec"), "spec", required=True)
    selector: dict[str, str | None] | None = None
    if spec.get("deviceSelector") is not None:
        raw = r.mapping(spec.get("deviceSelector"), "spec.deviceSelector")
        selector = {}
        for f in ("driver", "pool", "device"):
            value = raw.get(f)
            # A field left out selects any; the API server refuses an empty one, so "" is kept as given.
            selector[f] = None if value is None else r.string(value, f"spec.deviceSelector.{f}", max_len=253)
    taint = r.mapping(spec.get("taint"), "spec.taint", required=True)
    r.string(taint.get("key"), "spec.taint.key", required=True, max_len=317)
    r.string(taint.get("effect"), "spec.taint.effect", required=True, max_len=64)
    r.string(taint.get("value"), "spec.taint.value", max_len=63)
    return DeviceTaintRuleRecord(
        meta=meta, selector=selector, taint={f: taint[f] for f in TAINT_FIELDS if f in taint}
    )


def pod_uses_gpus(obj: dict[str, Any]) -> bool:
    """Pods worth storing: they use resource claims or ask for a GPU extended resource."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(spec, dict):
        return False
    if spec.get("resourceClaims"):
        return True
    return _gpu_requests(spec) > 0


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
    "DeviceTaintRule": normalize_device_taint_rule,
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
