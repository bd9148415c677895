"""The writer of the per-GPU read model (:class:`~fleet.models.GpuState` and its device counts).

Called by :mod:`fleet.ingest.apply` inside the transaction of every batch that wrote or deleted devices or
allocations, with the pools the batch touched: those pools' rows are recomputed from their current
devices and allocations (a pool is the unit because the dynamic-MIG counter rule and the newest
generation are per pool, and a GPU's devices are published in one pool). A claim batch changes only who
holds some devices: it recomputes the GPUs of those devices (and of devices sharing a counter set with
them), see :func:`units_moved_by`. A relist recomputes the pools of what it wrote or deleted; an initial
sync, the whole cluster, once for its kinds (:func:`after_first_list`). Several batches applied in one
transaction (an import: every kind of a snapshot) recompute once, at the end, under :func:`one_refresh`.
The rows come from :func:`rows_of`, a pure function over the same inputs the per-device counts read, so
the read model counts by :mod:`fleet.counts`' rules only.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import orjson
from django.db import connection, transaction
from django.db.models import Count, Max, QuerySet, TextField
from django.db.models.functions import Cast

from fleet import counts, heatmap, selectors
from fleet.ingest import locks, rule_taints, statistics
from fleet.ingest.sql import in_clauses, write_rows
from fleet.models import Device, DeviceGroupState, GpuState, ReadModelVersion, ResourceSlice
from fleet.normalize import FULL_GPU_SLICES
from fleet.selectors import CounterSets, DeviceKey, Holder

DEVICE_FIELDS = (*selectors.SUMMARY_FIELDS, "node_name", "gpu_minor", "taints", "product_name")
READ_MODEL = (GpuState, DeviceGroupState)
DeviceName = tuple[str, str, str]  # driver, pool, device name


def rows_of(
    devices: Sequence[Mapping[str, Any]],
    holders: Mapping[DeviceKey, list[Holder]],
    counter_sets: CounterSets,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The read model's rows (GpuState's, DeviceGroupState's, as column dicts) of some pools' current
    devices (dicts with :data:`DEVICE_FIELDS`), the claims holding them (:func:`selectors.allocation_holders`)
    and the pools' counter sets. Pure; precondition: ``devices`` come with every device sharing a counter
    set with one of them and every device of their units (whole pools are; :func:`units_moved_by` keeps
    that), with their holders and counter sets, since the counter rule spans a counter set."""
    allocated = set(holders)
    blocked = selectors.unavailable_devices(list(devices), allocated, counter_sets)  # type: ignore[arg-type]
    shown_blocked = heatmap.shown_blocked(devices, allocated, blocked)
    units = counts.units(devices, allocated, selectors.reserved_keys(holders), blocked)
    first: dict[counts.UnitKey, Mapping[str, Any]] = {}
    members: dict[counts.UnitKey, list[Mapping[str, Any]]] = {}
    for d in devices:
        key = counts.unit_key(d)
        first.setdefault(key, d)
        members.setdefault(key, []).append(d)
    gpus: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    for key, unit in units.items():
        d0 = first[key]
        where = {"cluster_id": key[0], "driver": d0["driver"], "pool": d0["pool"]}
        for g in unit.groups.values():
            groups.append(
                {
                    **where,
                    "unit": key[1],
                    "node_name": d0["node_name"],
                    "model": g.model,
                    "kind": g.kind,
                    "profile": g.profile,
                    "total": g.total,
                    "allocated": g.allocated,
                    "reserved": g.reserved,
                    "unavailable": g.unavailable,
                    "tainted": g.tainted,
                    "free": g.free,
                    "memory_bytes": g.memory_bytes,
                }
            )
        if unit.gpu is not None:
            gpus.append({**where, **_gpu_row(unit, members[key], holders, shown_blocked)})
    return gpus, groups


def _gpu_row(
    unit: counts.Unit,
    devices: list[Mapping[str, Any]],
    holders: Mapping[DeviceKey, list[Holder]],
    shown_blocked: set[DeviceKey],
) -> dict[str, Any]:
    """A GpuState row's own columns (the heatmap's rules for node, index and holders). One walk over
    the GPU's devices: this runs once per GPU of every recompute (40,000 in an L cluster's)."""
    assert unit.gpu is not None
    gpu = unit.gpu
    held: list[Holder] = []
    taints: set[str] = set()
    whole: list[int] = []
    minors: list[int] = []
    partitions: list[tuple[int, str, bool]] = []
    blocked = False
    product_name = ""
    mig_devices = tainted_devices = 0
    for d in devices:
        key = _key(d)
        its_holders = holders.get(key)
        if its_holders:
            held.extend(its_holders)
        if d["tainted"]:
            tainted_devices += 1
            taints.update(counts.taint_text(d["taints"] or ()))
        minor = d["gpu_minor"]
        if minor is not None:
            minors.append(minor)
            if d["kind"] == "gpu":
                whole.append(minor)
        if d["kind"] == "mig":
            mig_devices += 1
            partitions.append((d["compute_slices"], d["mig_profile"], key in holders))
        blocked = blocked or key in shown_blocked
        product_name = max(product_name, d["product_name"])
    names = sorted({f"{h.namespace}/{h.name}" for h in held})
    groups = unit.groups.values()
    return {
        "gpu_uuid": str(devices[0]["gpu_uuid"]),
        "node_name": devices[0]["node_name"],  # blank when the pool is not node-local
        "model": gpu.model,
        "gpu_minor": max(whole) if whole else (min(minors) if minors else None),
        "mig": gpu.mig,
        "dynamic": gpu.dynamic,
        "whole_allocated": gpu.whole,
        "tainted": gpu.tainted,
        "taints": sorted(taints),
        "compute_slices_used": gpu.used,
        "compute_slices_allocated": min(gpu.used, FULL_GPU_SLICES),
        "devices": unit.devices,
        "devices_allocated": unit.allocated,
        "partitions_free": sum(g.free for g in groups if g.kind == "mig"),
        "partitions_unavailable": sum(g.unavailable for g in groups if g.kind == "mig"),
        "reserved": any(h.state == "reserved" for h in held),
        "unreserved": any(h.state != "reserved" for h in held),
        "holders": names,
        "claims": len(names),
        "counter_blocked": blocked,
        "product_name": product_name,
        "mig_devices": mig_devices,
        "tainted_devices": tainted_devices,
        "layout": heatmap.layout(partitions, gpu.dynamic) if gpu.mig else "",
    }


def _key(d: Mapping[str, Any]) -> DeviceKey:
    return (d["cluster_id"], d["driver"], d["pool"], d["name"])


def units_moved_by(
    devices: Sequence[Mapping[str, Any]], changed: Collection[DeviceKey]
) -> list[Mapping[str, Any]]:
    """Of some pools' current devices, those of the units (:func:`counts.unit_key`) whose rows a change of
    who holds the ``changed`` devices can move: their own units, and every unit with a device drawing on a
    counter set one of those draws on (the counter rule blocks or frees it). Closed under both, so every
    device returned comes with all devices that share a counter set with it, as :func:`rows_of` needs.
    Pure. A GPU's partitions draw on its own counter set, so a claim's change moves the GPUs it held."""
    by_unit: dict[counts.UnitKey, list[Mapping[str, Any]]] = {}
    by_set: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for d in devices:
        by_unit.setdefault(counts.unit_key(d), []).append(d)
        for consumption in d["counters_consumed"]:
            by_set.setdefault(_counter_set(d, consumption), []).append(d)
    units: set[counts.UnitKey] = set()
    sets: set[tuple[str, str, str]] = set()
    todo = [d for d in devices if _key(d) in changed]
    while todo:
        d = todo.pop()
        unit = counts.unit_key(d)
        if unit not in units:
            units.add(unit)
            todo.extend(by_unit[unit])
        for consumption in d["counters_consumed"]:
            counter_set = _counter_set(d, consumption)
            if counter_set not in sets:
                sets.add(counter_set)
                todo.extend(by_set[counter_set])
    return [d for d in devices if counts.unit_key(d) in units]


def _counter_set(d: Mapping[str, Any], consumption: Mapping[str, Any]) -> tuple[str, str, str]:
    return (d["driver"], d["pool"], str(consumption.get("counterSet")))


def _device_dicts(devices: QuerySet[Device]) -> list[dict[str, Any]]:
    """Device dicts with :data:`DEVICE_FIELDS`; the JSON columns are read as text and decoded by orjson,
    only where not empty (Django's per-value stdlib decoding was a third of a large refresh).

    Equal texts share one decoded value (read only, as everything here is): the L fleet's 105,604
    devices have ~200 distinct counter consumptions. Rows come as tuples (``values_list``) zipped into
    dicts: Django's ``values()`` builds each dict through a comprehension of its own."""
    plain = [f for f in DEVICE_FIELDS if f not in _JSON_FIELDS]
    texts = {f"{f}_text": Cast(f, TextField()) for f in _JSON_FIELDS}
    names = (*plain, *_JSON_FIELDS)
    first_json = len(plain)
    decoded: dict[str, Any] = {"": [], "[]": []}
    out = []
    for row in devices.annotate(**texts).values_list(*plain, *texts):
        values = list(row)
        for i in range(first_json, len(values)):
            text = values[i] or ""
            value = decoded.get(text)
            if value is None:
                value = decoded[text] = orjson.loads(text)
            values[i] = value
        out.append(dict(zip(names, values, strict=True)))
    return out


_JSON_FIELDS = ("counters_consumed", "taints")


def refresh(
    cluster_id: int,
    pools: Collection[str] | None = None,
    *,
    held: Collection[DeviceName] | None = None,
    retaint: bool = True,
    version: bool = True,
) -> int:
    """Recompute the read model's rows of ``pools`` (pool names, every driver) of a cluster, or of the
    whole cluster with ``None``, from the stored devices and allocations; returns the GPU rows written.
    Call inside the ingest transaction that changed them. A constant number of statements per batch of
    pools on PostgreSQL (one batch unless a whole large cluster is recomputed, see :func:`_pool_batches`;
    elsewhere long lists of names are chunked).

    With ``held`` (devices whose holders alone changed, all in ``pools``: a claim batch's), only the rows
    of the units they move are recomputed (:func:`units_moved_by`): a claim on one GPU of an eight-GPU
    node rewrites one GPU's rows, not eight.

    First the DeviceTaintRules' taints of the pools' devices are brought up to date (``retaint``; a batch
    may have rewritten device rows with their published taints only). With ``version`` the cluster gets a
    new :class:`ReadModelVersion` token, which the readers' caches compare."""
    locks.read_model_lock(cluster_id)
    # A first list may have left the whole cluster to this recompute. Not for ``version=False``: the
    # migrations' rebuild runs before the table of versions and debts exists.
    if version and _owed(cluster_id):
        pools, held, retaint = None, None, True
        _paid.set(True)
    if held is not None and pools is not None:
        # No re-taint: who holds a device changes none of its attributes, which the rules select on.
        return _refresh_units(cluster_id, sorted(set(pools)), held, version)
    if retaint:
        rule_taints.retaint(cluster_id, pools)
    stored = [m.objects.filter(cluster_id=cluster_id) for m in READ_MODEL]
    if pools is None:
        batches: Iterable[list[str] | None] = _pool_batches(cluster_id)
    else:
        names = sorted(set(pools))
        if not names:
            return 0
        stored = [rows.filter(pool__in=names) for rows in stored]
        batches = [names]
    revision = _next_revision(cluster_id)
    if version:
        _new_version(cluster_id)
    for rows in stored:
        rows.delete()  # nothing refers to these rows: one DELETE each
    return sum(_write(*_rows_of_pools(cluster_id, batch), revision) for batch in batches)


def _refresh_units(cluster_id: int, names: list[str], held: Collection[DeviceName], version: bool) -> int:
    """:func:`refresh` of the units ``held`` moves, in the pools ``names``."""
    current, counter_sets = _current_of_pools(cluster_id, names)
    moved = units_moved_by(current, {(cluster_id, *d) for d in held})
    if not moved:
        return 0
    units = sorted({counts.unit_key(d)[1] for d in moved})
    gpus, groups = rows_of(moved, selectors.allocation_holders([cluster_id], pools=names), counter_sets)
    revision = _next_revision(cluster_id)
    if version:
        _new_version(cluster_id)
    uuids = [unit.removeprefix("gpu:") for unit in units if unit.startswith("gpu:")]
    for model, column, values in ((GpuState, "gpu_uuid", uuids), (DeviceGroupState, "unit", units)):
        for where, params in in_clauses(column, values):
            stored = model.objects.filter(cluster_id=cluster_id, pool__in=names)
            stored.extra(where=[where], params=params).delete()
    return _write(gpus, groups, revision)


def _write(gpus: list[dict[str, Any]], groups: list[dict[str, Any]], revision: int) -> int:
    """Insert recomputed rows (their old ones deleted), the GPU rows stamped with ``revision``; returns
    the GPU rows written."""
    for gpu in gpus:
        gpu["revision"] = revision
    write_rows(GpuState, gpus)
    write_rows(DeviceGroupState, groups)
    return len(gpus)


def _next_revision(cluster_id: int) -> int:
    """After the read-model lock: the recomputes of a cluster get increasing revisions in the order they
    commit."""
    return (GpuState.objects.filter(cluster_id=cluster_id).aggregate(r=Max("revision"))["r"] or 0) + 1


def _new_version(cluster_id: int) -> None:
    """A new token for the cluster's :class:`ReadModelVersion`, committed with the rows. Every recompute
    that versions is one an owed whole-cluster recompute turned into, or came after: it clears the debt."""
    _save_version(cluster_id, owed=False, update_fields=["token", "owed"])


def _save_version(cluster_id: int, owed: bool, update_fields: list[str]) -> None:
    """Upsert the cluster's :class:`ReadModelVersion` row (created with a new token), updating
    ``update_fields``."""
    ReadModelVersion.objects.bulk_create(
        [ReadModelVersion(cluster_id=cluster_id, token=secrets.randbits(62), owed=owed)],
        update_conflicts=True,
        unique_fields=["cluster"],
        update_fields=update_fields,
    )


def _owed(cluster_id: int) -> bool:
    return ReadModelVersion.objects.filter(cluster_id=cluster_id, owed=True).exists()


def _rows_of_pools(
    cluster_id: int, names: list[str] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """:func:`rows_of` for some pools of a cluster (every pool with ``None``), read from the database."""
    current, counter_sets = _current_of_pools(cluster_id, names)
    holders = selectors.allocation_holders([cluster_id], pools=names)
    return rows_of(current, holders, counter_sets)


def _current_of_pools(cluster_id: int, names: list[str] | None) -> tuple[list[dict[str, Any]], CounterSets]:
    """The current devices (:data:`DEVICE_FIELDS`) and counter sets of some pools (every pool with None)."""
    slices = ResourceSlice.objects.filter(cluster_id=cluster_id)
    devices = Device.objects.filter(cluster_id=cluster_id)
    if names is not None:
        slices, devices = slices.filter(pool__in=names), devices.filter(pool__in=names)
    newest, counter_sets = selectors.newest_generations(slices)
    return selectors.of_newest(_device_dicts(devices), newest), counter_sets


def _pool_batches(cluster_id: int) -> list[list[str] | None]:
    """A whole cluster's pools in batches of at most about :data:`REFRESH_DEVICES` devices (a pool is never
    split: the counter rule is per pool), or one batch without a filter when the cluster is that small.

    A device's dict and its share of the rows in flight are ~5 KB: the XL fleet's million devices at once
    took the watch worker from 1 GB to 5.5 GB at the end of its initial sync."""
    sizes = (
        Device.objects.filter(cluster_id=cluster_id)
        .values_list("pool")
        .annotate(n=Count("pk"))
        .order_by("pool")
    )
    batches: list[list[str] | None] = []
    batch: list[str] = []
    in_batch = 0
    for pool, n in sizes:
        if batch and in_batch + n > REFRESH_DEVICES:
            batches.append(batch)
            batch, in_batch = [], 0
        batch.append(pool)
        in_batch += n
    # One batch: one read of all of it beats a filter naming every pool.
    return [*batches, batch] if batches else [None]


# Devices whose read-model rows a whole-cluster recompute computes at a time: the L fleet's ~105,000 in one
# go (as before batching), the XL fleet's million in about ten.
REFRESH_DEVICES = 120_000


# Set when a recompute paid what a first list owed (the whole cluster, from no rows): the ingest call that
# made it analyzes the read model after its commit (took_owed), as a first list's does; else the planner
# takes the ~100,000 new rows of an L cluster for none until autovacuum's next round.
_paid: ContextVar[bool] = ContextVar("read_model_paid", default=False)


def took_owed() -> bool:
    """Whether a recompute of this thread paid an owed whole-cluster recompute since the last call. An
    ingest call asks once before its transaction (a rolled-back payment is not its own) and once after."""
    paid = _paid.get()
    _paid.set(False)
    return paid


# Cluster id -> the pools to recompute at the end of the enclosing :func:`one_refresh` (None: all of them).
_deferred: ContextVar[dict[int, set[str] | None] | None] = ContextVar("read_model_deferred", default=None)


def update(
    cluster_id: int, pools: Collection[str] | None, held: Collection[DeviceName] | None = None
) -> bool:
    """What a batch calls after writing devices or allocations of ``pools`` (None: anywhere in the
    cluster), or only the holders of the devices ``held`` (in ``pools``): the rows are recomputed now, or
    noted for the end of the enclosing :func:`one_refresh` (which recomputes whole pools). True when
    recomputed now."""
    pending = _deferred.get()
    if pending is None:
        refresh(cluster_id, pools, held=held)
        return True
    if cluster_id in pending and pending[cluster_id] is None:
        return False
    if pools is None:
        pending[cluster_id] = None
    else:
        pending.setdefault(cluster_id, set()).update(pools)  # type: ignore[union-attr]
    return False


def after_first_list(cluster_id: int, listing_elsewhere: Callable[[], bool]) -> bool:
    """What a kind's first list calls instead of ``update(cluster_id, None)``: its rows are all new, so
    the whole cluster is recomputed, unless another kind whose rows the read model derives from is still
    in its first list; True when recomputed now.

    A cluster's initial sync lists its slices and its claims at the same time, and each first list
    recomputed the whole cluster at its commit, one after the other under the read model's lock: two
    thirds of a second of Python per 10,000 GPUs each, the largest part of the L fleet's sync. The
    first of them to commit recomputes nothing when the other is still listing (``listing_elsewhere``,
    read under the read model's lock: that list has not committed, and takes the lock after this one
    has): it leaves the cluster :attr:`~fleet.models.ReadModelVersion.owed`, and the next recompute of
    the cluster, the other list's at the latest, recomputes all of it (:func:`refresh`). A stream whose
    round fails pays the debt itself (:func:`settle`), so it never waits on a list that will not come."""
    if _deferred.get() is not None:
        return update(cluster_id, None)
    locks.read_model_lock(cluster_id)
    if not listing_elsewhere():
        refresh(cluster_id, None)
        return True
    _save_version(cluster_id, owed=True, update_fields=["owed"])  # the readers' token stays: nothing changed
    return False


def pay_owed(cluster_id: int) -> bool:
    """Inside an ingest transaction that recomputes nothing itself (a list that changed nothing, a first
    list of no objects): recompute the whole cluster if a first list left it owed; True if so. Inside
    :func:`one_refresh` its end does (:func:`refresh` pays what is owed)."""
    if _deferred.get() is not None:
        return False
    locks.read_model_lock(cluster_id)
    if not _owed(cluster_id):
        return False
    refresh(cluster_id, None)
    return True


def settle(cluster_id: int) -> bool:
    """:func:`pay_owed` in a transaction of its own: for a stream whose list failed, which the debt may
    have counted on (once its state no longer says it is listing)."""
    took_owed()  # what an earlier call left set, were it rolled back, is not this one's
    with transaction.atomic():
        paid = pay_owed(cluster_id)
    if took_owed():
        statistics.analyze(READ_MODEL)
    return paid


@contextmanager
def one_refresh() -> Iterator[None]:
    """Batches applied inside recompute the read model once, at the end, for everything they touched.

    Use inside the one transaction that applies them (an import), so the rows still commit with what they
    derive from. Each batch recomputing its own pools cost an import of the L fleet two full recomputes (the
    slices', then the claims'), the second with every pool name in its filter; the recompute reads the
    batches' uncommitted rows, which this transaction sees. Not re-entrant: an inner block joins the outer."""
    if not connection.in_atomic_block:
        raise RuntimeError("one_refresh() needs the transaction that applies the batches")
    if _deferred.get() is not None:
        yield
        return
    pending: dict[int, set[str] | None] = {}
    token = _deferred.set(pending)
    try:
        yield
    finally:
        _deferred.reset(token)
    for cluster_id, pools in pending.items():
        if pools is not None and len(pools) * 2 >= _pool_count(cluster_id):
            pools = None  # most of the cluster: one read of all of it beats a filter naming every pool
        written = refresh(cluster_id, pools)
        statistics.analyze_if_grown(GpuState, written, READ_MODEL)
    took_owed()  # what the recomputes wrote decided above


def _pool_count(cluster_id: int) -> int:
    return ResourceSlice.objects.filter(cluster_id=cluster_id).values("pool").distinct().count()


def rebuild_all(cluster_ids: Iterable[int]) -> None:
    """Recompute every cluster's rows (the migration that creates the read model fills it so). The device
    rows already carry their rules' taints (ingest wrote them), and a migration may run before the rules'
    table exists: no re-taint. Nor a new token: a migration may run before the tokens' table exists, and
    the one that creates it gives every cluster a token."""
    for cid in cluster_ids:
        refresh(cid, retaint=False, version=False)
