"""The only writer of the fleet and claim tables.

A batch of records (upserts and deletes) is applied in one transaction with a constant number of bulk
statements per table, whatever the batch size (up to the database's parameter limit per statement). A record
older than the stored resourceVersion is ignored (the fence is in the SQL, so two racing writers cannot
regress a row). After commit one change event per batch goes to the channel layer group.

Kinds are described by :class:`TableSpec` s registered per kind: fleet registers its own here, ``claims``
registers the claim kinds when its app loads, so ``fleet`` never imports ``claims``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from django.conf import settings
from django.db import connection, models, transaction
from django.utils import timezone

from fleet.models import Cluster, Device, DeviceClass, Node, ResourceSlice, WatchCursor
from fleet.normalize import DeviceClassRecord, NodeRecord, Record, SliceRecord

log = logging.getLogger(__name__)

Op = Literal["upsert", "delete"]


@dataclass(frozen=True, slots=True)
class Change:
    """One watch event, normalized: an upsert of a record, or a delete of it."""

    op: Op
    record: Record


@dataclass(frozen=True)
class ChildSpec:
    """Rows derived from a parent record (devices of a slice, allocations of a claim), replaced with it."""

    model: type[models.Model]
    parent_column: str  # the child's column holding the parent's key value
    parent_field: str  # the parent's column it refers to ("name" for slices, "uid" for claims)
    parent_value: Callable[[Any], str]  # that value from the parent record
    rows: Callable[[Any], list[dict[str, Any]]]
    conflict: tuple[str, ...]
    # A child published by two parents at once keeps the one with the highest value here (a device in
    # an old and a new pool generation's slice keeps the newer), whatever order the parents come in.
    fence: str | None = None


@dataclass(frozen=True)
class TableSpec:
    """How one Kubernetes kind is stored."""

    model: type[models.Model]
    natural_key: tuple[str, ...]  # columns after cluster_id, e.g. ("namespace", "name")
    row: Callable[[Any], dict[str, Any]]
    children: tuple[ChildSpec, ...] = ()

    def key_of(self, record: Any) -> tuple[str, ...]:
        return record.meta.key if "namespace" in self.natural_key else (record.meta.name,)


SPECS: dict[str, TableSpec] = {}


def register(kind: str, spec: TableSpec) -> None:
    SPECS[kind] = spec


@dataclass
class BatchResult:
    """What a batch changed: natural keys written (inserted or updated) and deleted, and what was stale."""

    kind: str
    written: list[tuple[str, ...]] = field(default_factory=list)
    deleted: list[tuple[str, ...]] = field(default_factory=list)
    stale: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.written or self.deleted)


@dataclass(frozen=True)
class CursorUpdate:
    """The stream position to save in the same transaction as the batch."""

    resource_version: int
    state: str = "watching"
    objects: int | None = None


# ------------------------------------------------------------------------------------------- public API


def apply_batch(
    cluster: Cluster, kind: str, changes: Sequence[Change], cursor: CursorUpdate | None = None
) -> BatchResult:
    """Apply watch events of one kind in one transaction; the last change per object wins."""
    spec = SPECS[kind]
    last: dict[tuple[str, ...], Change] = {}
    for change in changes:
        last[spec.key_of(change.record)] = change
    upserts = [c.record for c in last.values() if c.op == "upsert"]
    deletes = [c.record for c in last.values() if c.op == "delete"]
    with transaction.atomic():
        result = BatchResult(kind)
        result.written = _upsert(cluster, spec, upserts)
        result.stale = len(upserts) - len(result.written)
        result.deleted = _delete(cluster, spec, deletes)
        if cursor:
            _save_cursor(cluster, kind, cursor)
        _publish_on_commit(cluster, result)
    return result


def replace_all(
    cluster: Cluster, kind: str, records: Sequence[Record], list_resource_version: int, cursor: bool = True
) -> BatchResult:
    """After a list: upsert every record; delete stored objects absent from it, unless newer than the list."""
    spec = SPECS[kind]
    with transaction.atomic():
        result = BatchResult(kind)
        stored = WatchCursor.objects.filter(cluster=cluster, kind=kind).values_list(
            "resource_version", flat=True
        )
        if stored and int(stored[0]) > list_resource_version:
            # The server went back in time (etcd restored, cluster rebuilt under the same name): our
            # rows may carry versions the server will never reach again, so the fence cannot apply.
            log.warning("%s/%s: list at %d is older than our cursor %d; replacing all", cluster.name, kind,
                        list_resource_version, int(stored[0]))  # fmt: skip
            all_keys = [
                tuple(k)
                for k in spec.model._default_manager.filter(cluster=cluster).values_list(*spec.natural_key)
            ]
            _delete_keys(cluster, spec, all_keys)
        result.written = _upsert(cluster, spec, records)
        result.stale = len(records) - len(result.written)
        present = {spec.key_of(r) for r in records}
        absent = [
            key
            for key in spec.model._default_manager.filter(
                cluster=cluster, resource_version__lte=list_resource_version
            ).values_list(*spec.natural_key)
            if tuple(key) not in present
        ]
        result.deleted = _delete_keys(cluster, spec, [tuple(k) for k in absent])
        if cursor:
            _save_cursor(cluster, kind, CursorUpdate(list_resource_version, "watching", objects=len(records)))
        _publish_on_commit(cluster, result)
    return result


def get_or_create_cluster(name: str, description: str = "") -> Cluster:
    cluster, _ = Cluster.objects.get_or_create(name=name, defaults={"description": description})
    return cluster


def drop_cluster(name: str) -> None:
    """Forget a cluster and everything mirrored from it (the demo starts each run from scratch)."""
    Cluster.objects.filter(name=name).delete()


# ------------------------------------------------------------------------------------------- SQL


OR_CHUNK = 500  # keys per OR-chained DELETE: under SQLite's expression depth limit (1000)
IN_CHUNK = 10_000  # values per IN list: under both backends' bound-parameter limits


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _max_rows(columns: int) -> int:
    """Rows per statement under the backend's bound-parameter limit (SQLite 32766, PostgreSQL 65535)."""
    limit = 32000 if connection.vendor == "sqlite" else 65000
    return max(1, limit // columns)


def _prep(model: type[models.Model], rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    names = [str(f.column) for f in fields]
    values = [[f.get_db_prep_save(row[f.attname], connection) for f in fields] for row in rows]
    return names, values


def _insert_sql(
    model: type[models.Model],
    columns: list[str],
    n_rows: int,
    conflict: Sequence[str],
    fence: str | None,
    returning: Sequence[str],
) -> str:
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    updates = ", ".join(f"{qn(c)} = excluded.{qn(c)}" for c in columns if c not in conflict)
    sql = (
        f"INSERT INTO {table} ({', '.join(qn(c) for c in columns)}) VALUES {', '.join([row] * n_rows)} "
        f"ON CONFLICT ({', '.join(qn(c) for c in conflict)}) DO UPDATE SET {updates}"
    )
    if fence:
        # The fence: never let an older version (resourceVersion, pool generation) overwrite a newer one.
        sql += f" WHERE {table}.{qn(fence)} <= excluded.{qn(fence)}"
    if returning:
        sql += " RETURNING " + ", ".join(qn(c) for c in returning)
    return sql


def _bulk_upsert(
    model: type[models.Model],
    rows: list[dict[str, Any]],
    conflict: Sequence[str],
    fence: str | None,
    returning: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    if not rows:
        return []
    columns, values = _prep(model, rows)
    if connection.vendor == "postgresql" and len(values) >= COPY_ROWS and connection.in_atomic_block:
        return _copy_upsert(model, columns, values, conflict, fence, returning)
    out: list[tuple[Any, ...]] = []
    step = _max_rows(len(columns))
    with connection.cursor() as cur:
        for start in range(0, len(values), step):
            chunk = values[start : start + step]
            sql = _insert_sql(model, columns, len(chunk), conflict, fence, returning)
            cur.execute(sql, [v for row in chunk for v in row])
            if returning:
                out.extend(tuple(r) for r in cur.fetchall())
    return out


COPY_ROWS = 2000  # from this many rows, COPY beats a statement with tens of thousands of placeholders


def _copy_upsert(
    model: type[models.Model],
    columns: list[str],
    values: list[list[Any]],
    conflict: Sequence[str],
    fence: str | None,
    returning: Sequence[str],
) -> list[tuple[Any, ...]]:
    """The same upsert (conflict rule, fence, RETURNING) for large batches on PostgreSQL: COPY the rows
    into a temporary table, then one INSERT ... SELECT. Client-side placeholder handling of the VALUES
    form costs more than the database's work at this size. Call inside a transaction."""
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    staging = qn(f"ingest_{model._meta.db_table}")
    cols = ", ".join(qn(c) for c in columns)
    sql = _insert_sql(model, columns, 1, conflict, fence, returning)
    values_clause = "VALUES (" + ", ".join(["%s"] * len(columns)) + ")"
    sql = sql.replace(values_clause, f"SELECT {cols} FROM {staging}", 1)
    with connection.cursor() as cur:
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {staging} ON COMMIT DROP AS "
            f"SELECT {cols} FROM {table} WITH NO DATA"
        )
        cur.execute(f"TRUNCATE {staging}")
        with cur.cursor.copy(f"COPY {staging} ({cols}) FROM STDIN") as copy:
            for row in values:
                copy.write_row(row)
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()] if returning else []


def _upsert(cluster: Cluster, spec: TableSpec, records: Sequence[Any]) -> list[tuple[str, ...]]:
    if not records:
        return []
    now = timezone.now()
    rows = []
    for record in records:
        row = _common_row(record)
        row.update(spec.row(record))
        row["cluster_id"] = cluster.pk
        row["synced_at"] = now
        rows.append(row)
    conflict = ("cluster_id", *spec.natural_key)
    replaced_uids = _replaced_uids(cluster, spec, records) if spec.children else []
    written = [
        tuple(r)
        for r in _bulk_upsert(
            spec.model, rows, conflict, fence="resource_version", returning=spec.natural_key
        )
    ]
    if spec.children and written:
        by_key = {spec.key_of(r): r for r in records}
        written_records = [by_key[k] for k in written]
        for child in spec.children:
            if child.parent_field == "uid" and replaced_uids:
                # An object deleted and recreated under the same name: its old children go too.
                _delete_children_of(cluster, child, replaced_uids)
            _replace_children(cluster, child, written_records)
    return written


def _replaced_uids(cluster: Cluster, spec: TableSpec, records: Sequence[Any]) -> list[str]:
    """Stored uids that the batch replaces with another uid under the same natural key."""
    new_uid = {spec.key_of(r): r.meta.uid for r in records}
    names = sorted({r.meta.name for r in records})
    manager = spec.model._default_manager
    old: list[str] = []
    for chunk in _chunks(names, IN_CHUNK):
        for row in manager.filter(cluster=cluster, name__in=chunk).values_list(*spec.natural_key, "uid"):
            key, uid = tuple(row[:-1]), row[-1]
            if key in new_uid and new_uid[key] != uid:
                old.append(uid)
    return old


def _replace_children(cluster: Cluster, child: ChildSpec, parents: list[Any]) -> None:
    _delete_children_of(cluster, child, [child.parent_value(p) for p in parents])
    rows = []
    for parent in parents:
        for row in child.rows(parent):
            row["cluster_id"] = cluster.pk
            rows.append(row)
    _bulk_upsert(
        child.model, _dedupe(rows, child.conflict, child.fence), ("cluster_id", *child.conflict), child.fence
    )


def _dedupe(rows: list[dict[str, Any]], key: Sequence[str], fence: str | None) -> list[dict[str, Any]]:
    """One row per key (PostgreSQL refuses to upsert a row twice in one statement): the newest wins."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        k = tuple(row[c] for c in key)
        if k not in seen or fence is None or row[fence] >= seen[k][fence]:
            seen[k] = row
    return list(seen.values())


def _delete_children_of(cluster: Cluster, child: ChildSpec, parent_values: Sequence[str]) -> None:
    manager = child.model._default_manager
    for chunk in _chunks(parent_values, IN_CHUNK):
        manager.filter(cluster=cluster, **{f"{child.parent_column}__in": chunk}).delete()


def _delete(cluster: Cluster, spec: TableSpec, records: Sequence[Any]) -> list[tuple[str, ...]]:
    """Delete objects named by DELETED events: only the same uid, and only if not newer than the event."""
    qn = connection.ops.quote_name
    table = qn(spec.model._meta.db_table)
    cols = [qn(c) for c in spec.natural_key]
    clause = " AND ".join(
        [f"{c} = %s" for c in cols] + [f"{qn('uid')} = %s", f"{qn('resource_version')} <= %s"]
    )
    returning = [*cols, qn("name"), qn("uid")]
    n = len(cols)
    deleted: list[tuple[str, ...]] = []
    for chunk in _chunks(records, OR_CHUNK):
        params: list[Any] = [cluster.pk]
        for record in chunk:
            params.extend(spec.key_of(record))
            params.extend([record.meta.uid, Decimal(record.meta.resource_version)])
        sql = (
            f"DELETE FROM {table} WHERE {qn('cluster_id')} = %s AND ("
            + " OR ".join(f"({clause})" for _ in chunk)
            + f") RETURNING {', '.join(returning)}"
        )
        with connection.cursor() as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        _delete_children(cluster, spec, {"name": [r[n] for r in rows], "uid": [r[n + 1] for r in rows]})
        deleted.extend(tuple(r[:n]) for r in rows)
    return deleted


def _delete_keys(cluster: Cluster, spec: TableSpec, keys: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Delete objects by natural key (a relist no longer has them), in chunks."""
    manager = spec.model._default_manager
    for chunk in _chunks(keys, OR_CHUNK):
        query = models.Q()
        for key in chunk:
            query |= models.Q(**dict(zip(spec.natural_key, key, strict=True)))
        doomed = manager.filter(models.Q(cluster=cluster) & query)
        parents: dict[str, list[str]] = {"name": [], "uid": []}
        for name, uid in doomed.values_list("name", "uid"):
            parents["name"].append(name)
            parents["uid"].append(uid)
        doomed.delete()
        _delete_children(cluster, spec, parents)
    return keys


def _delete_children(cluster: Cluster, spec: TableSpec, parents: dict[str, list[str]]) -> None:
    for child in spec.children:
        _delete_children_of(cluster, child, parents[child.parent_field])


def _common_row(record: Any) -> dict[str, Any]:
    meta = record.meta
    row = {
        "uid": meta.uid,
        "name": meta.name,
        "resource_version": Decimal(meta.resource_version),
        "created_at": meta.created_at,
        "labels": meta.labels,
        "raw": meta.raw,
    }
    if meta.namespace:
        row["namespace"] = meta.namespace
    return row


def _save_cursor(cluster: Cluster, kind: str, cursor: CursorUpdate) -> None:
    defaults: dict[str, Any] = {
        "resource_version": Decimal(cursor.resource_version),
        "state": cursor.state,
        "last_event_at": timezone.now(),
    }
    if cursor.objects is not None:
        defaults["object_count"] = cursor.objects
    WatchCursor.objects.update_or_create(cluster=cluster, kind=kind, defaults=defaults)


# ------------------------------------------------------------------------------------------- events


def change_event(cluster: Cluster, result: BatchResult) -> dict[str, Any]:
    return {
        "type": "fleet.change",
        "cluster": cluster.name,
        "kind": result.kind,
        "written": ["/".join(k) for k in result.written],
        "deleted": ["/".join(k) for k in result.deleted],
    }


ChangeListener = Callable[[dict[str, Any]], object]
_listeners: list[ChangeListener] = []


def add_change_listener(listener: ChangeListener) -> None:
    """Call ``listener(event)`` after each committed batch (claims registers its diagnosis trigger here,
    so fleet does not import claims)."""
    if listener not in _listeners:
        _listeners.append(listener)


def _publish_on_commit(cluster: Cluster, result: BatchResult) -> None:
    if not result.changed:
        return
    event = change_event(cluster, result)
    transaction.on_commit(lambda: _notify(event))


def _notify(event: dict[str, Any]) -> None:
    publish(event)
    for listener in _listeners:
        try:
            listener(event)
        except Exception:  # a listener's failure must not undo or block ingestion
            log.exception("change listener %r failed for %s %s", listener, event["cluster"], event["kind"])


def publish(event: dict[str, Any]) -> None:
    """Send a change event to the channel-layer group; a failure is logged, never raised into ingest."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    try:
        if loop is not None:
            # Called from code running inside an event loop's thread: schedule, don't block the loop.
            task = loop.create_task(layer.group_send(settings.CLAIMSCOPE_INGEST_GROUP, event))
            _pending.add(task)
            task.add_done_callback(_pending.discard)
        else:
            async_to_sync(layer.group_send)(settings.CLAIMSCOPE_INGEST_GROUP, event)
    except Exception:  # the database is the truth; a lost notification only delays a page update
        log.exception("could not publish change event for %s %s", event["cluster"], event["kind"])


_pending: set[asyncio.Task[None]] = set()  # keeps scheduled sends alive until done


# ------------------------------------------------------------------------------------------- fleet kinds


def _node_row(r: NodeRecord) -> dict[str, Any]:
    return {
        "ready": r.ready,
        "unschedulable": r.unschedulable,
        "gpu_product": r.gpu_product,
        "clique": r.clique,
    }


def _class_row(r: DeviceClassRecord) -> dict[str, Any]:
    return {"selectors": r.selectors, "extended_resource_name": r.extended_resource_name}


def _slice_row(r: SliceRecord) -> dict[str, Any]:
    return {
        "driver": r.driver,
        "pool": r.pool,
        "pool_generation": r.pool_generation,
        "pool_slice_count": r.pool_slice_count,
        "node_name": r.node_name,
        "all_nodes": r.all_nodes,
        "per_device_node_selection": r.per_device_node_selection,
        "shared_counters": r.shared_counters,
        "device_count": len(r.devices),
    }


def _device_rows(r: SliceRecord) -> list[dict[str, Any]]:
    return [
        {
            "driver": r.driver,
            "pool": r.pool,
            "name": d.name,
            "slice_name": r.meta.name,
            "pool_generation": r.pool_generation,
            "node_name": d.node_name,
            "kind": d.kind,
            "model": d.model,
            "product_name": d.product_name,
            "uuid": d.uuid,
            "parent_uuid": d.parent_uuid,
            "gpu_uuid": d.gpu_uuid,
            "gpu_minor": d.gpu_minor,
            "mig_profile": d.mig_profile,
            "compute_slices": d.compute_slices,
            "memory_bytes": d.memory_bytes,
            "taints": d.taints,
            "tainted": any(t.get("effect") in ("NoSchedule", "NoExecute") for t in d.taints),
            "counters_consumed": d.counters_consumed,
            "attributes": d.attributes,
            "capacity": d.capacity,
        }
        for d in r.devices
    ]


register("Node", TableSpec(Node, ("name",), _node_row))
register("DeviceClass", TableSpec(DeviceClass, ("name",), _class_row))
register(
    "ResourceSlice",
    TableSpec(
        ResourceSlice,
        ("name",),
        _slice_row,
        children=(
            ChildSpec(
                Device,
                parent_column="slice_name",
                parent_field="name",
                parent_value=lambda r: r.meta.name,
                rows=_device_rows,
                conflict=("driver", "pool", "name"),
                fence="pool_generation",
            ),
        ),
    ),
)


def kinds() -> Iterable[str]:
    return SPECS.keys()
