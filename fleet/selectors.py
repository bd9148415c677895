"""Read queries over the fleet tables, shared by pages, API, websocket snapshots and commands.

What the counts mean is defined once, in :mod:`fleet.counts`; this module reads the rows they judge:
- only devices of a pool's highest generation count;
- allocated = named in an existing claim's allocation results (adminAccess results excluded);
- unavailable = the counter rule (:func:`unavailable_devices`) or a taint.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from django.db.models import BooleanField, Count, ExpressionWrapper, Max, Q, QuerySet

from fleet import counts
from fleet.counts import DeviceKey as DeviceKey
from fleet.counts import FleetSummary as FleetSummary
from fleet.counts import GroupCount as GroupCount
from fleet.counts import ModelTotals as ModelTotals
from fleet.models import Device, DeviceAllocation, ResourceSlice
from fleet.quantity import QuantityError, parse_quantity

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
    # A consumption's counters parsed once per object: the read model's recompute shares equal
    # consumptions among its devices (``gpu_state._device_dicts``: the L fleet's 105,604 devices have
    # ~200), and parsing each counter of each device was most of this rule's time there. Keyed by id:
    # every consumption stays referenced by ``devices`` until this returns, so no id is reused meanwhile.
    parsed: dict[int, tuple[str, tuple[tuple[str, int], ...]]] = {}

    def needs(consumption: dict[str, Any]) -> tuple[str, tuple[tuple[str, int], ...]]:
        known = parsed.get(id(consumption))
        if known is None:
            counters = consumption.get("counters") or {}
            known = (
                str(consumption.get("counterSet")),
                tuple((name, _counter_value(counter)) for name, counter in counters.items()),
            )
            parsed[id(consumption)] = known
        return known

    used: dict[tuple[PoolKey, str], dict[str, int]] = {}
    for d in devices:
        if d["counters_consumed"] and (d["cluster_id"], d["driver"], d["pool"], d["name"]) in allocated:
            pool = (d["cluster_id"], d["driver"], d["pool"])
            for consumption in d["counters_consumed"]:
                set_name, counters = needs(consumption)
                in_set = used.setdefault((pool, set_name), {})
                for name, need in counters:
                    in_set[name] = in_set.get(name, 0) + need
    blocked: set[DeviceKey] = set()
    nothing: dict[str, int] = {}
    no_sets: dict[str, dict[str, int]] = {}
    for d in devices:
        if not d["counters_consumed"]:
            continue
        key = (d["cluster_id"], d["driver"], d["pool"], d["name"])
        if key in allocated:
            continue
        sets = counter_sets.get(key[:3], no_sets)
        for consumption in d["counters_consumed"]:
            set_name, counters = needs(consumption)
            capacity = sets.get(set_name, nothing)
            in_set = used.get((key[:3], set_name), nothing)
            for name, need in counters:
                if in_set.get(name, 0) + need > capacity.get(name, 0):
                    blocked.add(key)
                    break
    return blocked


def reserved_keys(holders: Mapping[DeviceKey, list[Holder]]) -> set[DeviceKey]:
    """Devices held by a reserved claim (in use by a consumer)."""
    return {k for k, held in holders.items() if any(h.state == "reserved" for h in held)}


def summarize(
    devices: Iterable[dict[str, Any]],
    holders: Mapping[DeviceKey, list[Holder]],
    counter_sets: CounterSets | None = None,
) -> FleetSummary:
    """Count devices by group and state, and physical GPUs per model (:func:`fleet.counts.summarize`):
    allocated and reserved from ``holders`` (:func:`allocation_holders`), unavailable from the counter
    rule over ``counter_sets`` and from taints."""
    devices = list(devices)
    allocated = set(holders)
    blocked = unavailable_devices(devices, allocated, counter_sets) if counter_sets is not None else set()
    return counts.summarize(devices, allocated, reserved_keys(holders), blocked)


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
    return of_newest(devices.values(*SUMMARY_FIELDS), newest), counters


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


def of_newest(rows: Iterable[dict[str, Any]], newest: dict[PoolKey, int]) -> list[dict[str, Any]]:
    """Device rows of their pool's newest generation (pools without slices keep their devices)."""
    return [
        d
        for d in rows
        if d["pool_generation"] >= newest.get((d["cluster_id"], d["driver"], d["pool"]), d["pool_generation"])
    ]


def allocated_keys(cluster_id: int | None = None) -> set[DeviceKey]:
    """Devices named in claims' allocation results, adminAccess results excluded."""
    rows = DeviceAllocation.objects.filter(admin_access=False)
    if cluster_id is not None:
        rows = rows.filter(cluster_id=cluster_id)
    return {tuple(r) for r in rows.values_list("cluster_id", "driver", "pool", "device_name")}  # type: ignore[misc]


def fleet_summary(cluster_id: int | None = None) -> FleetSummary:
    """The fleet's counts (one cluster's with ``cluster_id``), from the per-GPU read model."""
    from fleet import readmodel

    return readmodel.fleet_summary(None if cluster_id is None else [cluster_id])


def gpu_models() -> list[str]:
    """The models of the fleet's current GPU and MIG devices, sorted, from the per-GPU read model."""
    from fleet import readmodel

    return readmodel.gpu_models()


def fleet_summary_per_device(cluster_id: int | None = None) -> FleetSummary:
    """:func:`fleet_summary` from every current device and allocation: what the read model's rows are
    tested against, and rebuilt from."""
    devices, counter_sets = current_devices(cluster_id)
    holders = allocation_holders(None if cluster_id is None else [cluster_id])
    return summarize(devices, holders, counter_sets)


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
    current = of_newest(devices.values(*fields), newest)
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
    rows = DeviceAllocation.objects.filter(admin_access=False)
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


# ------------------------------------------------------------------ heatmap per physical GPU

# A physical GPU as the read model stores it: cluster id, driver, pool, gpu uuid, node (blank when the pool
# is not node-local), model, index, allocated compute slices (uncapped), tainted, reserved, unreserved,
# blocked by counters, MIG layout, claims holding it.
GpuStateRow = tuple[int, str, str, str, str, str, int | None, int, bool, bool, bool, bool, str, int]
_GPU_STATE_FIELDS = (
    "cluster_id", "driver", "pool", "gpu_uuid", "node_name", "model", "gpu_minor", "compute_slices_used",
    "tainted", "reserved", "unreserved", "counter_blocked", "layout", "claims",
)  # fmt: skip


def gpu_states(cluster_ids: Iterable[int], pools: Iterable[PoolKey] | None = None) -> list[GpuStateRow]:
    """The per-GPU read model's rows of the clusters (limited to ``pools`` when given); one query."""
    from fleet.models import GpuState

    rows = GpuState.objects.filter(cluster_id__in=list(cluster_ids))
    if pools is None:
        return cast(list[GpuStateRow], list(rows.values_list(*_GPU_STATE_FIELDS)))
    keys = set(pools)
    rows = rows.filter(pool__in=sorted({k[2] for k in keys}))
    return [r for r in cast(Iterable[GpuStateRow], rows.values_list(*_GPU_STATE_FIELDS)) if r[:3] in keys]


def cluster_versions(cluster_ids: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """Per cluster, a value that changes whenever the per-GPU read model of one of its pools is recomputed
    (ingest does so in the transaction of every write of a slice, and so its devices, or of a claim, and
    so its allocations): the number of GPU rows and the newest revision. One indexed aggregate: the cheap
    check before :func:`pool_versions`."""
    from fleet.models import GpuState

    rows = (
        GpuState.objects.filter(cluster_id__in=list(cluster_ids))
        .values_list("cluster_id")
        .annotate(Count("id"), Max("revision"))
        .order_by()
    )
    return {cid: (n, revision) for cid, n, revision in rows}


def pool_versions(
    cluster_ids: Iterable[int], pools: Iterable[PoolKey] | None = None
) -> dict[PoolKey, tuple[int, ...]]:
    """Per pool, what :func:`cluster_versions` is per cluster: its GPU rows and their revision (a pool
    missing from the result has no GPU left to show). With ``pools``, only those are read (through the
    read model's pool index), so the cost follows what changed, not the size of the clusters."""
    from fleet.models import GpuState

    ids = list(cluster_ids)
    rows = GpuState.objects.filter(cluster_id__in=ids)
    wanted = None
    if pools is not None:
        wanted = {k for k in pools if k[0] in ids}
        if not wanted:
            return {}
        rows = rows.filter(pool__in=sorted({k[2] for k in wanted}))
    grouped = rows.values_list("cluster_id", "driver", "pool").annotate(Count("id"), Max("revision"))
    return {
        (cid, driver, pool): (n, revision)
        for cid, driver, pool, n, revision in grouped.order_by()
        if wanted is None or (cid, driver, pool) in wanted
    }


def node_versions(cluster_ids: Iterable[int]) -> dict[int, tuple[Any, ...]]:
    """Per cluster, a value that changes when a node is written or deleted (labels for the label filter)."""
    from fleet.models import Node

    rows = (
        Node.objects.filter(cluster_id__in=list(cluster_ids))
        .values_list("cluster_id")
        .annotate(n=Count("id"), t=Max("synced_at"))
        .order_by()
    )
    return {cid: (n, t) for cid, n, t in rows}


def counter_devices(
    cluster_ids: Iterable[int], pools: Iterable[PoolKey]
) -> tuple[list[dict[str, Any]], CounterSets]:
    """Current GPU/MIG devices of ``pools`` that consume counters, with their ``counters_consumed`` and
    physical GPU, and the pools' counter sets: what the dynamic-MIG blocked-partition rule reads. Two
    queries."""
    keys = set(pools)
    names = sorted({k[2] for k in keys})
    ids = list(cluster_ids)
    newest, counter_sets = newest_generations(
        ResourceSlice.objects.filter(cluster_id__in=ids, pool__in=names)
    )
    rows = (
        Device.objects.filter(cluster_id__in=ids, pool__in=names, kind__in=("gpu", "mig"))
        .exclude(counters_consumed=[])
        .values("cluster_id", "driver", "pool", "name", "gpu_uuid", "pool_generation", "counters_consumed")
    )
    devices = [
        d
        for d in of_newest(cast(Iterable[dict[str, Any]], rows), newest)
        if (d["cluster_id"], d["driver"], d["pool"]) in keys
    ]
    return devices, {k: v for k, v in counter_sets.items() if k in keys}


# ------------------------------------------------------------------- overview scope


@dataclass(frozen=True)
class OverviewScope:
    """Which devices the overview counts: clusters, and optionally one model, one pool and some nodes
    (the node-label filter, resolved to (cluster id, node name) pairs; ``None`` means every node)."""

    cluster_ids: tuple[int, ...]
    model: str = ""
    pool: str = ""
    nodes: tuple[tuple[int, str], ...] | None = None
