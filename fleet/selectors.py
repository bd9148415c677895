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

from django.apps import apps
from django.db import connection, transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, Max, Model, Q, QuerySet

from fleet import counts
from fleet.counts import DeviceKey as DeviceKey
from fleet.counts import FleetSummary as FleetSummary
from fleet.counts import GroupCount as GroupCount
from fleet.counts import ModelTotals as ModelTotals
from fleet.models import Device, ResourceSlice
from fleet.normalize import FULL_GPU_SLICES
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
    # Read through the app registry: fleet never imports claims, but allocations are facts about devices.
    allocation = apps.get_model("claims", "DeviceAllocation")
    rows = allocation.objects.filter(admin_access=False)
    if cluster_id is not None:
        rows = rows.filter(cluster_id=cluster_id)
    return {tuple(r) for r in rows.values_list("cluster_id", "driver", "pool", "device_name")}  # type: ignore[misc]


def fleet_summary(cluster_id: int | None = None) -> FleetSummary:
    """The fleet's counts (one cluster's with ``cluster_id``), from the per-GPU read model."""
    from fleet import readmodel

    return readmodel.fleet_summary(None if cluster_id is None else [cluster_id])


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


# ------------------------------------------------------------------ heatmap per physical GPU (PostgreSQL)

# One row per physical GPU, aggregated by PostgreSQL: 40,000 rows instead of the ~100,000 device dicts a
# Python pass would build (which took seconds on the L fleet). The rules are those of ``heatmap.gpu_records``
# (tested equal): current generation only, allocated = named by a claim's (non-adminAccess) allocation,
# MIG profiles listed for static MIG and, for dynamic MIG, only the allocated partitions. Held claims are
# returned as "namespace/name" lines; a GPU's claims are counted once however many of its devices they hold.
_GPU_SQL = """
WITH newest AS (
  SELECT cluster_id, driver, pool, max(pool_generation) AS generation
  FROM fleet_resourceslice WHERE cluster_id = ANY(%(clusters)s) {slice_pools}
  GROUP BY cluster_id, driver, pool
),
held AS (
  SELECT a.cluster_id, a.driver, a.pool, a.device_name,
         bool_or(c.state = 'reserved') AS reserved, bool_or(c.state <> 'reserved') AS unreserved,
         string_agg(c.namespace || '/' || c.name, E'\\n') AS claims
  FROM claims_deviceallocation a
  JOIN claims_resourceclaim c ON c.cluster_id = a.cluster_id AND c.uid = a.claim_uid
  WHERE NOT a.admin_access AND a.cluster_id = ANY(%(clusters)s) {allocation_pools}
  GROUP BY a.cluster_id, a.driver, a.pool, a.device_name
)
SELECT d.cluster_id, min(d.driver), min(d.pool), d.gpu_uuid,
  min(coalesce(nullif(d.node_name, ''), d.pool)), min(d.model),
  coalesce(max(d.gpu_minor) FILTER (WHERE d.kind = 'gpu'), min(d.gpu_minor)),
  coalesce(sum(d.compute_slices) FILTER (WHERE h.claims IS NOT NULL), 0),
  bool_or(d.tainted), coalesce(bool_or(h.reserved), false), coalesce(bool_or(h.unreserved), false),
  bool_or(d.kind = 'mig' AND d.counters_consumed <> '[]'::jsonb),
  bool_or(h.claims IS NOT NULL AND d.counters_consumed <> '[]'::jsonb),
  string_agg(d.compute_slices || ' ' || d.mig_profile || ' ' || (h.claims IS NOT NULL)::int, E'\\n')
    FILTER (WHERE d.kind = 'mig' AND (h.claims IS NOT NULL OR d.counters_consumed = '[]'::jsonb)),
  string_agg(h.claims, E'\\n')
FROM fleet_device d
LEFT JOIN newest n ON n.cluster_id = d.cluster_id AND n.driver = d.driver AND n.pool = d.pool
LEFT JOIN held h
  ON h.cluster_id = d.cluster_id AND h.driver = d.driver AND h.pool = d.pool AND h.device_name = d.name
WHERE d.kind IN ('gpu', 'mig') AND d.gpu_uuid <> '' AND d.cluster_id = ANY(%(clusters)s) {device_pools}
  AND d.pool_generation >= coalesce(n.generation, d.pool_generation)
GROUP BY d.cluster_id, d.gpu_uuid
"""
_IN_POOLS = (
    "AND ({alias}cluster_id, {alias}driver, {alias}pool) IN "
    "(SELECT * FROM unnest(%(pool_clusters)s::bigint[], %(pool_drivers)s::text[], %(pool_names)s::text[]))"
)

# A physical GPU as aggregated: cluster id, driver, pool, gpu uuid, node (or pool), model, index, allocated
# compute slices (uncapped), tainted, reserved, unreserved, dynamic MIG, an allocated device consumes
# counters, MIG profiles ("slices profile allocated" lines), held claims ("namespace/name" lines).
GpuRow = tuple[
    int, str, str, str, str, str, int | None, int, bool, bool, bool, bool, bool, str | None, str | None
]


def heatmap_gpu_rows(cluster_ids: Iterable[int], pools: Iterable[PoolKey] | None = None) -> list[GpuRow]:
    """One aggregated row per physical GPU of the clusters (limited to ``pools`` when given); one query.

    Precondition: the database is PostgreSQL (string_agg, bool_or, FILTER); other databases build the same
    records in Python from :func:`heatmap_devices`."""
    params: dict[str, Any] = {"clusters": list(cluster_ids)}
    where = {"slice_pools": "", "allocation_pools": "", "device_pools": ""}
    if pools is not None:
        keys = sorted(set(pools))
        params |= {
            "pool_clusters": [k[0] for k in keys],
            "pool_drivers": [k[1] for k in keys],
            "pool_names": [k[2] for k in keys],
        }
        where = {
            "slice_pools": _IN_POOLS.format(alias=""),
            "allocation_pools": _IN_POOLS.format(alias="a."),
            "device_pools": _IN_POOLS.format(alias="d."),
        }
    # The whole fleet's aggregate wants more than the default 4 MB of sort/hash memory, and parallel
    # workers would each recompute the CTEs on small hosts: both settings end with this atomic block.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        if pools is not None:
            # A few pools changed: probe the pool indexes per pool. The planner estimates a sequential scan
            # of every allocation of the cluster cheaper (38,000 on the L fleet, 20-40 ms, ~1 ms probed).
            cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(_GPU_SQL.format(**where), params)
        return cursor.fetchall()


_MICROS = "(extract(epoch FROM max({column})) * 1000000)::bigint"
_CLUSTER_VERSIONS_SQL = f"""
SELECT cluster_id, 's', count(*), {_MICROS.format(column="synced_at")} FROM fleet_resourceslice
WHERE cluster_id = ANY(%(clusters)s) GROUP BY cluster_id
UNION ALL
SELECT cluster_id, 'c', count(*), {_MICROS.format(column="synced_at")} FROM claims_resourceclaim
WHERE cluster_id = ANY(%(clusters)s) GROUP BY cluster_id
UNION ALL
SELECT cluster_id, 'a', count(*), 0 FROM claims_deviceallocation
WHERE cluster_id = ANY(%(clusters)s) GROUP BY cluster_id
"""
_POOL_VERSIONS_SQL = f"""
SELECT s.cluster_id, s.driver, s.pool, s.n, s.t, coalesce(a.n, 0), coalesce(a.t, 0)
FROM (
  SELECT cluster_id, driver, pool, count(*) AS n, {_MICROS.format(column="synced_at")} AS t
  FROM fleet_resourceslice WHERE cluster_id = ANY(%(clusters)s) GROUP BY cluster_id, driver, pool
) s LEFT JOIN (
  SELECT a.cluster_id, a.driver, a.pool, count(*) AS n, {_MICROS.format(column="c.synced_at")} AS t
  FROM claims_deviceallocation a
  JOIN claims_resourceclaim c ON c.cluster_id = a.cluster_id AND c.uid = a.claim_uid
  WHERE NOT a.admin_access AND a.cluster_id = ANY(%(clusters)s) GROUP BY a.cluster_id, a.driver, a.pool
) a ON a.cluster_id = s.cluster_id AND a.driver = s.driver AND a.pool = s.pool
"""
# The same for the named pools only. Driven by the list (LATERAL, one index probe of the slice and the
# allocation pool indexes per pool): with ``IN (unnest ...)`` the planner hashes the list and scans every
# slice and allocation of the cluster, which is what reading only the changed pools is meant to avoid.
_SOME_POOL_VERSIONS_SQL = f"""
SELECT p.cluster_id, p.driver, p.pool, s.n, s.t, a.n, a.t
FROM unnest(%(pool_clusters)s::bigint[], %(pool_drivers)s::text[], %(pool_names)s::text[])
  AS p(cluster_id, driver, pool)
CROSS JOIN LATERAL (
  SELECT count(*) AS n, coalesce({_MICROS.format(column="synced_at")}, 0) AS t FROM fleet_resourceslice
  WHERE cluster_id = p.cluster_id AND driver = p.driver AND pool = p.pool
) s
CROSS JOIN LATERAL (
  SELECT count(*) AS n, coalesce({_MICROS.format(column="c.synced_at")}, 0) AS t
  FROM claims_deviceallocation a
  JOIN claims_resourceclaim c ON c.cluster_id = a.cluster_id AND c.uid = a.claim_uid
  WHERE NOT a.admin_access AND a.cluster_id = p.cluster_id AND a.driver = p.driver AND a.pool = p.pool
) a
WHERE s.n > 0
"""


def cluster_versions(cluster_ids: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """Per cluster, a value that changes whenever ingest writes or deletes a slice (and so its devices)
    or a claim (and so its allocations): counts and the latest ``synced_at`` (ingest stamps every row it
    writes with the time of the write, so a write moves the maximum; a delete changes a count). One query
    of three small aggregates: the cheap check before :func:`pool_versions`."""
    if connection.vendor != "postgresql":
        return _cluster_versions_orm(list(cluster_ids))
    out: dict[int, list[int]] = defaultdict(lambda: [0] * 6)
    with connection.cursor() as cursor:
        cursor.execute(_CLUSTER_VERSIONS_SQL, {"clusters": list(cluster_ids)})
        for cid, table, n, t in cursor.fetchall():
            i = "sca".index(table) * 2
            out[cid][i : i + 2] = [n, t or 0]
    return {cid: tuple(v) for cid, v in out.items()}


def _pool_params(pools: Iterable[PoolKey]) -> dict[str, list[Any]]:
    keys = sorted(set(pools))
    return {
        "pool_clusters": [k[0] for k in keys],
        "pool_drivers": [k[1] for k in keys],
        "pool_names": [k[2] for k in keys],
    }


def pool_versions(
    cluster_ids: Iterable[int], pools: Iterable[PoolKey] | None = None
) -> dict[PoolKey, tuple[int, ...]]:
    """Per pool, what :func:`cluster_versions` is per cluster: slice and allocation counts and the latest
    write of a slice or of a claim allocated in it. One query (a pool without slices has no devices to
    show, so pools are those of the slices: a pool of ``pools`` missing from the result has none left).
    With ``pools``, only those are read (through the slice and allocation pool indexes), so the cost
    follows what changed, not the size of the clusters."""
    ids = list(cluster_ids)
    if connection.vendor != "postgresql":
        return _pool_versions_orm(ids, pools)
    with connection.cursor() as cursor:
        if pools is None:
            cursor.execute(_POOL_VERSIONS_SQL, {"clusters": ids})
        else:
            keys = [k for k in pools if k[0] in ids]
            if not keys:
                return {}
            cursor.execute(_SOME_POOL_VERSIONS_SQL, _pool_params(keys))
        return {(cid, driver, pool): tuple(v) for cid, driver, pool, *v in cursor.fetchall()}


# The same versions through the ORM, for the embedded SQLite: equal where PostgreSQL's are equal (the feed
# only compares a version with the previous one of the same process), written with portable aggregates.
def _cluster_versions_orm(ids: list[int]) -> dict[int, tuple[Any, ...]]:
    claim_model = apps.get_model("claims", "ResourceClaim")
    allocation_model = apps.get_model("claims", "DeviceAllocation")
    out: dict[int, list[Any]] = defaultdict(lambda: [0, None, 0, None, 0, None])
    models: tuple[type[Model], ...] = (ResourceSlice, claim_model, allocation_model)
    for i, model in enumerate(models):
        stamp = Max("synced_at") if i < 2 else Max("id")
        rows = model._default_manager.filter(cluster_id__in=ids).values_list("cluster_id")
        rows = rows.annotate(Count("id"), stamp)
        for cid, n, t in rows.order_by():
            out[cid][i * 2 : i * 2 + 2] = [n, t]
    return {cid: tuple(v) for cid, v in out.items()}


def _pool_versions_orm(ids: list[int], pools: Iterable[PoolKey] | None) -> dict[PoolKey, tuple[Any, ...]]:
    allocation_model = apps.get_model("claims", "DeviceAllocation")
    wanted = None if pools is None else {k for k in pools if k[0] in ids}
    if wanted is not None and not wanted:
        return {}
    slices = ResourceSlice.objects.filter(cluster_id__in=ids)
    allocations = allocation_model.objects.filter(cluster_id__in=ids, admin_access=False)
    if wanted is not None:
        names = sorted({k[2] for k in wanted})
        slices, allocations = slices.filter(pool__in=names), allocations.filter(pool__in=names)
    by_slices = {
        (cid, driver, pool): (n, t)
        for cid, driver, pool, n, t in slices.values_list("cluster_id", "driver", "pool")
        .annotate(Count("id"), Max("synced_at"))
        .order_by()
    }
    by_allocations = {
        (cid, driver, pool): (n, t)
        for cid, driver, pool, n, t in allocations.values_list("cluster_id", "driver", "pool")
        .annotate(Count("id"), Max("claim__synced_at"))
        .order_by()
    }
    return {
        key: (*v, *by_allocations.get(key, (0, None)))
        for key, v in by_slices.items()
        if wanted is None or key in wanted
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


# The dynamic-MIG rule of :func:`unavailable_devices` (as :func:`fleet.heatmap.blocked_devices` narrows
# it: only devices sharing a counter set with an allocated device), evaluated by PostgreSQL over the
# counters' JSON, which Python took seconds to decode for the L fleet's 40,000 partitions. Quantities are
# parsed by Python (``_parse_counter``, the exact Kubernetes rules) and passed in as a table: a first
# run returns the amounts it has no value for, a second run the GPUs with a blocked partition. Capacity:
# the pool's newest-generation sharedCounters (should two slices define one set, its larger value).
_JSON_AMOUNT = (
    "CASE WHEN jsonb_typeof({v}) = 'object' THEN coalesce({v} ->> 'value', '0') "
    "ELSE {v} #>> ARRAY[]::text[] END"
)
_JSON_COUNTERS = (
    "CASE WHEN jsonb_typeof({c} -> 'counters') = 'object' THEN {c} -> 'counters' "
    "ELSE jsonb_build_object() END"
)
_BLOCKED_SQL = f"""
WITH newest AS (
  SELECT cluster_id, driver, pool, max(pool_generation) AS generation
  FROM fleet_resourceslice WHERE cluster_id = ANY(%(clusters)s) {{slice_pools}}
  GROUP BY cluster_id, driver, pool
),
alloc AS (
  SELECT DISTINCT a.cluster_id, a.driver, a.pool, a.device_name
  FROM claims_deviceallocation a
  JOIN claims_resourceclaim c ON c.cluster_id = a.cluster_id AND c.uid = a.claim_uid
  WHERE NOT a.admin_access AND a.cluster_id = ANY(%(clusters)s) {{allocation_pools}}
),
amounts AS MATERIALIZED (
  SELECT d.cluster_id, d.driver, d.pool, d.name, d.gpu_uuid, al.device_name IS NOT NULL AS allocated,
         coalesce(c.value ->> 'counterSet', 'None') AS counter_set, k.key AS counter,
         {_JSON_AMOUNT.format(v="k.value")} AS amount
  FROM fleet_device d
  LEFT JOIN newest n ON n.cluster_id = d.cluster_id AND n.driver = d.driver AND n.pool = d.pool
  LEFT JOIN alloc al
    ON al.cluster_id = d.cluster_id AND al.driver = d.driver AND al.pool = d.pool AND al.device_name = d.name
  CROSS JOIN LATERAL jsonb_array_elements(d.counters_consumed) c
  CROSS JOIN LATERAL jsonb_each({_JSON_COUNTERS.format(c="c.value")}) k
  WHERE d.kind IN ('gpu', 'mig') AND d.counters_consumed <> '[]'::jsonb AND d.cluster_id = ANY(%(clusters)s)
    {{device_pools}} AND d.pool_generation >= coalesce(n.generation, d.pool_generation)
),
capacity AS MATERIALIZED (
  SELECT s.cluster_id, s.driver, s.pool, coalesce(cs.value ->> 'name', 'None') AS counter_set,
         k.key AS counter, {_JSON_AMOUNT.format(v="k.value")} AS amount
  FROM fleet_resourceslice s
  JOIN newest n ON n.cluster_id = s.cluster_id AND n.driver = s.driver AND n.pool = s.pool
    AND s.pool_generation = n.generation
  CROSS JOIN LATERAL jsonb_array_elements(s.shared_counters) cs
  CROSS JOIN LATERAL jsonb_each({_JSON_COUNTERS.format(c="cs.value")}) k
),
known AS (SELECT * FROM unnest(%(texts)s::text[], %(values)s::numeric[]) AS v(amount, value)),
touched AS (SELECT DISTINCT cluster_id, driver, pool, counter_set FROM amounts WHERE allocated),
used AS (
  SELECT a.cluster_id, a.driver, a.pool, a.counter_set, a.counter, sum(v.value) AS used
  FROM amounts a JOIN known v USING (amount) WHERE a.allocated
  GROUP BY a.cluster_id, a.driver, a.pool, a.counter_set, a.counter
),
caps AS (
  SELECT c.cluster_id, c.driver, c.pool, c.counter_set, c.counter, max(v.value) AS capacity
  FROM capacity c JOIN known v USING (amount)
  GROUP BY c.cluster_id, c.driver, c.pool, c.counter_set, c.counter
),
candidates AS (
  SELECT DISTINCT a.cluster_id, a.driver, a.pool, a.name
  FROM amounts a JOIN touched USING (cluster_id, driver, pool, counter_set) WHERE NOT a.allocated
)
SELECT DISTINCT 'unknown', x.amount FROM (SELECT amount FROM amounts UNION SELECT amount FROM capacity) x
WHERE NOT EXISTS (SELECT 1 FROM known v WHERE v.amount = x.amount)
UNION ALL
SELECT DISTINCT a.cluster_id::text, a.gpu_uuid
FROM amounts a
JOIN candidates USING (cluster_id, driver, pool, name)
JOIN known v USING (amount)
LEFT JOIN used u USING (cluster_id, driver, pool, counter_set, counter)
LEFT JOIN caps c USING (cluster_id, driver, pool, counter_set, counter)
WHERE coalesce(u.used, 0) + v.value > coalesce(c.capacity, 0)
"""
_counter_amounts: dict[str, int] = {}  # counter value text -> whole units, for every text seen so far


def counter_blocked_gpus(cluster_ids: Iterable[int], pools: Iterable[PoolKey]) -> set[tuple[int, str]]:
    """(cluster id, gpu uuid) of the GPUs of ``pools`` with a device blocked by the counters its
    allocated siblings use (see ``_BLOCKED_SQL``). One query, two the first time new amounts appear.

    Precondition: PostgreSQL."""
    keys = sorted(set(pools))
    if not keys:
        return set()
    params: dict[str, Any] = {
        "clusters": list(cluster_ids),
        "pool_clusters": [k[0] for k in keys],
        "pool_drivers": [k[1] for k in keys],
        "pool_names": [k[2] for k in keys],
    }
    sql = _BLOCKED_SQL.format(
        slice_pools=_IN_POOLS.format(alias=""),
        allocation_pools=_IN_POOLS.format(alias="a."),
        device_pools=_IN_POOLS.format(alias="d."),
    )
    for _ in range(2):
        texts = sorted(_counter_amounts)
        params |= {"texts": texts, "values": [_counter_amounts[t] for t in texts]}
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL work_mem = '64MB'")
            cursor.execute("SET LOCAL max_parallel_workers_per_gather = 0")
            # The planner cannot estimate rows expanded from JSON: it picks nested loops over hundreds of
            # thousands of counter rows (minutes). Hash joins take well under a second; JIT only adds.
            cursor.execute("SET LOCAL enable_nestloop = off")
            cursor.execute("SET LOCAL jit = off")
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        unknown = [amount for kind, amount in rows if kind == "unknown"]
        if not unknown:
            return {(int(cid), uuid) for cid, uuid in rows}
        if len(_counter_amounts) + len(unknown) > 100_000:  # bounded: amounts are few in practice
            _counter_amounts.clear()
        for amount in unknown:
            _counter_amounts[amount] = _parse_counter(amount)
    raise AssertionError("counter amounts still unknown after parsing them")  # unreachable


# ------------------------------------------------------------------- overview counts (PostgreSQL aggregate)

# The overview page's counts per (cluster, model, kind, MIG profile) and per model's physical GPUs, grouped
# by PostgreSQL: the page used to build ~100,000 device dicts per request (seconds and hundreds of MB on the
# L fleet). The rules are :func:`summarize`'s over :func:`heatmap_devices` (tested equal): current
# generation only; allocated = named by a (non-adminAccess) allocation of an existing claim, as
# :func:`allocation_holders` joins them; reserved = one of its claims is reserved. Only "unavailable" (the
# counter rule) needs the counters' JSON: the devices that consume counters (41,600 on the L fleet) are
# read by :func:`overview_counts` and judged by :func:`unavailable_devices` itself.
_OVERVIEW_DEVICES_SQL = """
CREATE TEMPORARY TABLE overview_devices ON COMMIT DROP AS
WITH newest AS (
  SELECT cluster_id, driver, pool, max(pool_generation) AS generation
  FROM fleet_resourceslice WHERE cluster_id = ANY(%(clusters)s) {slice_pool}
  GROUP BY cluster_id, driver, pool
),
held AS (
  SELECT a.cluster_id, a.driver, a.pool, a.device_name, bool_or(c.state = 'reserved') AS reserved
  FROM claims_deviceallocation a
  JOIN claims_resourceclaim c ON c.cluster_id = a.cluster_id AND c.uid = a.claim_uid
  WHERE NOT a.admin_access AND a.cluster_id = ANY(%(clusters)s)
  GROUP BY a.cluster_id, a.driver, a.pool, a.device_name
)
SELECT d.cluster_id, d.driver, d.pool, d.name, d.model, d.kind, d.mig_profile, d.memory_bytes, d.tainted,
       d.gpu_uuid, d.compute_slices, d.counters_consumed <> '[]'::jsonb AS counters,
       CASE WHEN d.counters_consumed <> '[]'::jsonb THEN d.counters_consumed END AS counters_consumed,
       h.device_name IS NOT NULL AS allocated, coalesce(h.reserved, false) AS reserved
FROM fleet_device d
LEFT JOIN newest n ON n.cluster_id = d.cluster_id AND n.driver = d.driver AND n.pool = d.pool
LEFT JOIN held h
  ON h.cluster_id = d.cluster_id AND h.driver = d.driver AND h.pool = d.pool AND h.device_name = d.name
WHERE d.kind IN ('gpu', 'mig') AND d.cluster_id = ANY(%(clusters)s) {device_filters}
  AND d.pool_generation >= coalesce(n.generation, d.pool_generation)
"""
_OVERVIEW_GROUPS_SQL = f"""
SELECT cluster_id, model, kind, mig_profile, {counts.SQL_GROUP_COUNTS}
FROM overview_devices GROUP BY cluster_id, model, kind, mig_profile
"""
_OVERVIEW_GPUS_SQL = f"""
SELECT cluster_id, model, {counts.SQL_MODEL_TOTALS}
FROM (
  SELECT cluster_id, max(model) AS model, {counts.SQL_GPU_FLAGS}
  FROM overview_devices WHERE gpu_uuid <> '' GROUP BY cluster_id, gpu_uuid
) gpu GROUP BY cluster_id, model
"""
# One JSON document decoded by one orjson call: a Python step per row was seconds for 41,600 rows.
_OVERVIEW_COUNTERS_SQL = """
SELECT coalesce(json_agg(json_build_object(
  'cluster_id', cluster_id, 'driver', driver, 'pool', pool, 'name', name, 'model', model, 'kind', kind,
  'mig_profile', mig_profile, 'tainted', tainted, 'allocated', allocated,
  'counters_consumed', counters_consumed
)), '[]')::text
FROM overview_devices WHERE counters
"""

# (cluster id, model, kind, MIG profile, then counts.SQL_GROUP_COUNTS: total, allocated, reserved, tainted,
# tainted and not allocated, memory bytes)
OverviewGroupRow = tuple[int, str, str, str, int, int, int, int, int, int]
# (cluster id, model, then counts.SQL_MODEL_TOTALS: physical GPUs, carrying MIG, partitionable, allocated
# whole, tainted, allocated compute slices with each GPU's capped at 7)
OverviewGpuRow = tuple[int, str, int, int, int, int, int, int]


@dataclass(frozen=True)
class OverviewScope:
    """Which devices the overview counts: clusters, and optionally one model, one pool and some nodes
    (the node-label filter, resolved to (cluster id, node name) pairs; ``None`` means every node)."""

    cluster_ids: tuple[int, ...]
    model: str = ""
    pool: str = ""
    nodes: tuple[tuple[int, str], ...] | None = None


def _overview_sql(scope: OverviewScope) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"clusters": list(scope.cluster_ids)}
    device_filters, slice_pool = "", ""
    if scope.model:
        device_filters += " AND d.model = %(model)s"
        params["model"] = scope.model
    if scope.pool:
        device_filters += " AND d.pool = %(pool)s"
        slice_pool = "AND pool = %(pool)s"
        params["pool"] = scope.pool
    if scope.nodes is not None:
        device_filters += (
            " AND (d.cluster_id, d.node_name) IN"
            " (SELECT * FROM unnest(%(node_clusters)s::bigint[], %(node_names)s::text[]))"
        )
        params["node_clusters"] = [cid for cid, _ in scope.nodes]
        params["node_names"] = [name for _, name in scope.nodes]
    sql = _OVERVIEW_DEVICES_SQL.format(device_filters=device_filters, slice_pool=slice_pool)
    return sql, params


@dataclass
class OverviewCounts:
    """The overview's counts of a scope: per (cluster, model, kind, MIG profile), per model's physical
    GPUs, and the devices that consume counters (what :func:`unavailable_devices` reads, with
    ``allocated``)."""

    groups: list[OverviewGroupRow]
    gpus: list[OverviewGpuRow]
    counter_devices: list[dict[str, Any]]


def overview_counts(scope: OverviewScope) -> OverviewCounts:
    """The scope's current GPU/MIG devices, joined once to their allocations into a temporary table,
    then counted by three small queries over it. The counter devices come as one JSON document decoded
    by orjson (Django's stdlib decoding, a value at a time, took seconds for the L fleet's 41,600).

    Precondition: PostgreSQL (FILTER, unnest, temporary tables)."""
    import orjson

    sql, params = _overview_sql(scope)
    # Like heatmap_gpu_rows: the whole fleet's join wants more sort/hash memory than the default. Every
    # join here is of whole tables: without statistics (a database copied from a template and not
    # analyzed yet) the planner chose nested loops, minutes instead of a second.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        cursor.execute("SET LOCAL enable_nestloop = off")
        cursor.execute("SET LOCAL jit = off")
        # An enclosing transaction (tests) outlives ON COMMIT DROP: a second call drops the first's table.
        cursor.execute("DROP TABLE IF EXISTS overview_devices")
        cursor.execute(sql, params)
        cursor.execute(_OVERVIEW_GROUPS_SQL)
        groups = cast(list[OverviewGroupRow], cursor.fetchall())
        cursor.execute(_OVERVIEW_GPUS_SQL, {"full": FULL_GPU_SLICES})
        gpus = cast(list[OverviewGpuRow], cursor.fetchall())
        cursor.execute(_OVERVIEW_COUNTERS_SQL)
        counter_devices = orjson.loads(cursor.fetchone()[0])
        cursor.execute("DROP TABLE overview_devices")
    return OverviewCounts(groups, gpus, counter_devices)


def overview_counter_sets(scope: OverviewScope, pools: Iterable[str]) -> CounterSets:
    """The counter sets of some pools of the scope at their newest generation (:func:`newest_generations`)."""
    names = sorted(set(pools))
    if scope.pool:
        names = [p for p in names if p == scope.pool]
    slices = ResourceSlice.objects.filter(cluster_id__in=list(scope.cluster_ids), pool__in=names)
    return newest_generations(slices)[1]
