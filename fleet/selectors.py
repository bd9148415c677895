"""Read queries over the fleet tables, shared by pages, API, websocket snapshots and commands.

The counting rules live in pure functions (:func:`summarize`) so the same semantics serve every caller:
- only devices of a pool's highest generation count;
- allocated = named in a claim's allocation results (adminAccess results excluded);
- a physical GPU is counted once, however many MIG slices it carries; its allocated share is measured in
  compute slices out of 7 (static MIG: the N of allocated "Ng" devices; a full-GPU allocation is 7/7).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from django.apps import apps
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet

from fleet.models import Device, ResourceSlice
from fleet.normalize import FULL_GPU_SLICES
from fleet.quantity import QuantityError, parse_quantity

DeviceKey = tuple[int, str, str, str]  # cluster id, driver, pool, device name


@dataclass
class GroupCount:
    """Devices of one (model, kind, MIG profile) group by state."""

    model: str
    kind: str
    profile: str
    total: int = 0
    allocated: int = 0
    unavailable: int = 0  # not allocated, but its shared counters are used up by allocated siblings
    tainted: int = 0
    free: int = 0
    memory_bytes: int = 0  # sum over the group's devices (never added across groups of one GPU)


@dataclass
class ModelTotals:
    """Physical GPUs of one model family, partition-aware."""

    model: str
    gpus: int = 0
    gpus_full: int = 0  # published as a whole GPU (no MIG)
    gpus_mig: int = 0  # carrying MIG slices (static or dynamic)
    compute_slices: int = 0
    compute_slices_allocated: int = 0

    @property
    def allocated_fraction(self) -> float:
        return self.compute_slices_allocated / self.compute_slices if self.compute_slices else 0.0


@dataclass
class FleetSummary:
    groups: list[GroupCount] = field(default_factory=list)
    models: list[ModelTotals] = field(default_factory=list)
    devices: int = 0
    allocated: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for m, totals in zip(data["models"], self.models, strict=True):
            m["allocated_fraction"] = round(totals.allocated_fraction, 4)
        return data


PoolKey = tuple[int, str, str]  # cluster id, driver, pool
CounterSets = dict[PoolKey, dict[str, dict[str, int]]]  # pool -> counter set -> counter -> capacity


def counter_sets_of(shared_counters: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """A slice's ``sharedCounters`` as capacities; unreadable values count as zero capacity."""
    out: dict[str, dict[str, int]] = {}
    for counter_set in shared_counters:
        counters = counter_set.get("counters") or {}
        out[str(counter_set.get("name"))] = {name: _counter_value(c) for name, c in counters.items()}
    return out


def _counter_value(counter: Any) -> int:
    raw = counter.get("value", "0") if isinstance(counter, dict) else counter
    return _parse_counter(str(raw))


@lru_cache(maxsize=4096)
def _parse_counter(text: str) -> int:
    """Counter values as whole units, rounded up (counters count memory bytes, slices, engines).

    Integers, not Fractions: a large fleet sums hundreds of thousands of them, and Fraction arithmetic
    was most of a cold summary's time."""
    try:
        return math.ceil(parse_quantity(text).value)
    except QuantityError:
        return 0


def unavailable_devices(
    devices: list[dict[str, Any]], allocated: set[DeviceKey], counter_sets: CounterSets
) -> set[DeviceKey]:
    """Unallocated devices whose counter consumption no longer fits next to the allocated devices'.

    This is the partitionable-device (dynamic MIG) rule of the allocator: a partition and its full GPU
    draw on the same counter set, so allocating one blocks the overlapping others.
    """
    used: dict[tuple[PoolKey, str, str], int] = defaultdict(int)
    for d in devices:
        key = (d["cluster_id"], d["driver"], d["pool"], d["name"])
        if key in allocated:
            for consumption in d["counters_consumed"]:
                for name, counter in (consumption.get("counters") or {}).items():
                    used[(key[:3], str(consumption.get("counterSet")), name)] += _counter_value(counter)
    blocked: set[DeviceKey] = set()
    for d in devices:
        key = (d["cluster_id"], d["driver"], d["pool"], d["name"])
        if key in allocated or not d["counters_consumed"]:
            continue
        sets = counter_sets.get(key[:3], {})
        for consumption in d["counters_consumed"]:
            set_name = str(consumption.get("counterSet"))
            capacity = sets.get(set_name, {})
            for name, counter in (consumption.get("counters") or {}).items():
                need = _counter_value(counter)
                if used[(key[:3], set_name, name)] + need > capacity.get(name, 0):
                    blocked.add(key)
    return blocked


def summarize(
    devices: Iterable[dict[str, Any]], allocated: set[DeviceKey], counter_sets: CounterSets | None = None
) -> FleetSummary:
    """Count devices (dicts with Device's fields) by group and state, and physical GPUs per model.

    A device's state is the first that applies of: allocated, unavailable (counters used up), tainted
    (an untolerable NoSchedule/NoExecute taint), free.
    """
    devices = list(devices)
    blocked = unavailable_devices(devices, allocated, counter_sets) if counter_sets is not None else set()
    groups: dict[tuple[str, str, str], GroupCount] = {}
    gpu_model: dict[tuple[int, str], str] = {}
    gpu_has_full: set[tuple[int, str]] = set()
    gpu_has_mig: set[tuple[int, str]] = set()
    gpu_used: dict[tuple[int, str], int] = defaultdict(int)
    summary = FleetSummary()
    for d in devices:
        key = (d["model"], d["kind"], d["mig_profile"])
        group = groups.get(key) or groups.setdefault(key, GroupCount(*key))
        device_key = (d["cluster_id"], d["driver"], d["pool"], d["name"])
        is_allocated = device_key in allocated
        group.total += 1
        if is_allocated or not d["counters_consumed"]:
            # Dynamic-MIG placements overlap (seven 1g placements share one GPU's memory): only the
            # allocated ones hold memory; adding every possible placement would count it many times.
            group.memory_bytes += d["memory_bytes"] or 0
        if is_allocated:
            group.allocated += 1
        elif device_key in blocked:
            group.unavailable += 1
        elif d["tainted"]:
            group.tainted += 1
        else:
            group.free += 1
        summary.devices += 1
        summary.allocated += is_allocated
        if d["kind"] in ("gpu", "mig") and d["gpu_uuid"]:
            gpu = (d["cluster_id"], d["gpu_uuid"])
            gpu_model[gpu] = d["model"]
            (gpu_has_mig if d["kind"] == "mig" else gpu_has_full).add(gpu)
            if is_allocated:
                gpu_used[gpu] += d["compute_slices"]
    totals: dict[str, ModelTotals] = {}
    for gpu, model in gpu_model.items():
        t = totals.get(model) or totals.setdefault(model, ModelTotals(model))
        t.gpus += 1
        if gpu in gpu_has_mig:
            t.gpus_mig += 1
        else:
            t.gpus_full += 1
        t.compute_slices += FULL_GPU_SLICES
        t.compute_slices_allocated += min(gpu_used.get(gpu, 0), FULL_GPU_SLICES)
    summary.groups = sorted(groups.values(), key=lambda g: (g.model, g.kind, g.profile))
    summary.models = sorted(totals.values(), key=lambda t: t.model)
    return summary


SUMMARY_FIELDS = (
    "cluster_id", "driver", "pool", "name", "model", "kind", "mig_profile", "memory_bytes", "tainted",
    "gpu_uuid", "compute_slices", "pool_generation", "counters_consumed",
)  # fmt: skip


def current_devices(cluster_id: int | None = None) -> tuple[list[dict[str, Any]], CounterSets]:
    """Devices of each pool's highest generation (older generations are being replaced), and the
    pools' shared counter sets at that generation."""
    slices = ResourceSlice.objects.all()
    devices = Device.objects.all()
    if cluster_id is not None:
        slices = slices.filter(cluster_id=cluster_id)
        devices = devices.filter(cluster_id=cluster_id)
    newest, counters = newest_generations(slices)
    return _of_newest(devices.values(*SUMMARY_FIELDS), newest), counters


def newest_generations(slices: QuerySet[ResourceSlice]) -> tuple[dict[PoolKey, int], CounterSets]:
    """Each pool's highest generation among ``slices``, and its shared counter sets at that generation."""
    newest: dict[PoolKey, int] = {}
    counters: CounterSets = defaultdict(dict)
    rows = slices.values_list("cluster_id", "driver", "pool", "pool_generation", "shared_counters")
    for cid, driver, pool, generation, shared in rows.order_by("pool_generation"):
        key = (cid, driver, pool)
        if generation > newest.get(key, -1):
            newest[key] = generation
            counters[key] = {}
        counters[key].update(counter_sets_of(shared))
    return newest, dict(counters)


def _of_newest(rows: Iterable[dict[str, Any]], newest: dict[PoolKey, int]) -> list[dict[str, Any]]:
    """Device rows of their pool's newest generation (pools without slices keep their devices)."""
    return [
        d
        for d in rows
        if d["pool_generation"] >= newest.get((d["cluster_id"], d["driver"], d["pool"]), d["pool_generation"])
    ]


def allocated_keys(cluster_id: int | None = None) -> set[DeviceKey]:
    """Devices named in claims' allocation results, adminAccess results excluded."""
    # Read through the app registry: fleet never imports claims, but allocations are facts about devices.
    allocation = apps.get_model("claims", "DeviceAllocation")
    rows = allocation.objects.filter(admin_access=False)
    if cluster_id is not None:
        rows = rows.filter(cluster_id=cluster_id)
    return {tuple(r) for r in rows.values_list("cluster_id", "driver", "pool", "device_name")}  # type: ignore[misc]


def fleet_summary(cluster_id: int | None = None) -> FleetSummary:
    devices, counter_sets = current_devices(cluster_id)
    return summarize(devices, allocated_keys(cluster_id), counter_sets)


# ------------------------------------------------------------------------------- heatmap and pages (additive)

HEATMAP_FIELDS = (*SUMMARY_FIELDS, "node_name", "gpu_minor")


def heatmap_devices(
    cluster_ids: Iterable[int] | None = None,
    model: str = "",
    pool: str = "",
    extra: tuple[str, ...] = (),
    node: str = "",
    counters: bool = True,
) -> tuple[list[dict[str, Any]], CounterSets]:
    """GPU and MIG devices of each pool's highest generation (the :func:`current_devices` rule), with the
    fields the heatmap places them by, and the pools' counter sets. Two queries, whatever the fleet size.

    With ``counters=False`` the devices' ``counters_consumed`` are not read (decoding that JSON is most of
    the query's time on a large fleet): each device has ``counters_consumed=[]`` and a ``has_counters``
    flag; fetch the counters that matter with :func:`device_counters`."""
    slices = ResourceSlice.objects.all()
    devices = Device.objects.filter(kind__in=("gpu", "mig"))
    if cluster_ids is not None:
        ids = list(cluster_ids)
        slices = slices.filter(cluster_id__in=ids)
        devices = devices.filter(cluster_id__in=ids)
    if pool:
        slices = slices.filter(pool=pool)
        devices = devices.filter(pool=pool)
    if model:
        devices = devices.filter(model=model)
    if node:
        devices = devices.filter(node_name=node)
        # Counters live in the node's pools' slices, which may not name the node (perDeviceNodeSelection).
        slices = slices.filter(pool__in=devices.values("pool"))
    newest, counter_sets = newest_generations(slices)
    fields: tuple[str, ...] = (*HEATMAP_FIELDS, *extra)
    if not counters:
        fields = tuple(f for f in fields if f != "counters_consumed")
        flag = ExpressionWrapper(~Q(counters_consumed=[]), output_field=BooleanField())
        devices = devices.annotate(has_counters=flag)
        fields = (*fields, "has_counters")
    current = _of_newest(devices.values(*fields), newest)
    if not counters:
        for d in current:
            d["counters_consumed"] = []
    return current, counter_sets


def device_counters(
    cluster_ids: Iterable[int], pools: Iterable[str]
) -> dict[DeviceKey, list[dict[str, Any]]]:
    """``counters_consumed`` of the GPU/MIG devices of some pools that consume counters; one query."""
    rows = (
        Device.objects.filter(
            cluster_id__in=list(cluster_ids), pool__in=sorted(set(pools)), kind__in=("gpu", "mig")
        )
        .exclude(counters_consumed=[])
        .values_list("cluster_id", "driver", "pool", "name", "counters_consumed")
    )
    return {(cid, driver, pool, name): consumed for cid, driver, pool, name, consumed in rows}


@dataclass(frozen=True)
class Holder:
    """A claim holding a device (adminAccess results excluded), with its state and, when asked for, the
    consumers (``kind/name`` from ``reservedFor``) using it."""

    namespace: str
    name: str
    state: str
    consumers: tuple[str, ...] = ()


def allocation_holders(
    cluster_ids: Iterable[int] | None = None, pools: Iterable[str] | None = None, consumers: bool = False
) -> dict[DeviceKey, list[Holder]]:
    """The claims named in allocation results, per device: one query (allocations joined to claims).
    Its keys are :func:`allocated_keys`' (the same rule)."""
    allocation = apps.get_model("claims", "DeviceAllocation")
    rows = allocation.objects.filter(admin_access=False)
    if cluster_ids is not None:
        rows = rows.filter(cluster_id__in=list(cluster_ids))
    if pools is not None:
        rows = rows.filter(pool__in=list(pools))
    out: dict[DeviceKey, list[Holder]] = defaultdict(list)
    fields = [
        "cluster_id",
        "driver",
        "pool",
        "device_name",
        "claim__namespace",
        "claim__name",
        "claim__state",
    ]
    if consumers:
        fields.append("claim__reserved_for")
    for row in rows.values_list(*fields):
        cid, driver, pool, device, namespace, name, state = row[:7]
        used_by = tuple(
            f"{str(c.get('resource', 'pods')).rstrip('s')}/{c.get('name', '')}"
            for c in (row[7] if consumers else None) or ()
            if isinstance(c, dict)
        )
        out[(cid, driver, pool, device)].append(
            Holder(namespace or "", name or "", state or "allocated", used_by)
        )
    return dict(out)


def node_labels(cluster_ids: Iterable[int] | None = None) -> dict[tuple[int, str], dict[str, str]]:
    """Labels of every node, by (cluster id, node name)."""
    from fleet.models import Node

    nodes = Node.objects.all()
    if cluster_ids is not None:
        nodes = nodes.filter(cluster_id__in=list(cluster_ids))
    return {
        (cid, name): labels or {} for cid, name, labels in nodes.values_list("cluster_id", "name", "labels")
    }


def stream_cursors(cluster_ids: Iterable[int] | None = None) -> list[Any]:
    """Watch cursors with their cluster, by cluster name then kind."""
    from fleet.models import WatchCursor

    cursors = WatchCursor.objects.select_related("cluster").order_by("cluster__name", "kind")
    if cluster_ids is not None:
        cursors = cursors.filter(cluster_id__in=list(cluster_ids))
    return list(cursors)
