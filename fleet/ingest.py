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
import json
import logging
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from operator import itemgetter
from typing import Any, Literal

import orjson
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from fleet import commit_counter, counts
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
    # Optional history hooks (claims records claim state changes with them), called once per batch inside
    # its transaction with the batch's observation time: ``on_written(cluster, records written, observed_at)``
    # (stale records left out) and ``on_deleted(cluster, [(uid, deletionTimestamp or None)], observed_at)``.
    # They must stay bulk: a constant number of statements per call, whatever the batch size.
    on_written: Callable[[Cluster, list[Any], datetime], None] | None = None
    on_deleted: Callable[[Cluster, list[tuple[str, datetime | None]], datetime], None] | None = None

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
    resync: bool = False  # a relist (replace_all): its change event carries counts, not every key
    # (driver, pool) of every device or allocation row the batch may have written or deleted, old and new:
    # the heatmap re-reads only these pools. None: not known (a relist, or not PostgreSQL).
    pools: set[tuple[str, str]] | None = None

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
    cluster: Cluster,
    kind: str,
    changes: Sequence[Change],
    cursor: CursorUpdate | None = None,
    observed_at: datetime | None = None,
) -> BatchResult:
    """Apply watch events of one kind in one transaction; the last change per object wins.

    ``observed_at`` (default: now) is when the changes were seen; history hooks use it where Kubernetes gives
    no time of its own (a replay passes the simulated time)."""
    spec = SPECS[kind]
    observed_at = observed_at or timezone.now()
    last: dict[tuple[str, ...], Change] = {}
    for change in changes:
        last[spec.key_of(change.record)] = change
    upserts = [c.record for c in last.values() if c.op == "upsert"]
    deletes = [c.record for c in last.values() if c.op == "delete"]
    with transaction.atomic():
        _stream_lock(cluster, kind, exclusive=False)
        result = BatchResult(kind)
        touched = [*upserts, *deletes]
        pools = _child_pools(cluster, spec, touched)  # the rows about to be replaced or deleted
        result.written = _upsert(cluster, spec, upserts, observed_at)
        result.stale = len(upserts) - len(result.written)
        result.deleted = _delete(cluster, spec, deletes, observed_at)
        # ... and those written in their place (nothing written or deleted: no event, no pools needed)
        after = _child_pools(cluster, spec, touched) if result.changed else set()
        result.pools = None if pools is None or after is None else pools | after
        if cursor:
            _save_cursor(cluster, kind, cursor, forward_only=True)
        _publish_on_commit(cluster, result)
    return result


def replace_all(
    cluster: Cluster,
    kind: str,
    records: Iterable[Record],
    list_resource_version: int,
    cursor: bool = True,
    observed_at: datetime | None = None,
) -> BatchResult:
    """After a list: upsert every record; delete stored objects absent from it, unless newer than the list.

    ``records`` may be lazy (a generator normalizing the list): on a cluster's initial sync they are
    consumed while COPY streams them, so normalizing overlaps the server's work on the rows already sent;
    otherwise they are collected first."""
    spec = SPECS[kind]
    observed_at = observed_at or timezone.now()
    with transaction.atomic():
        fresh = _lock_if_fresh(cluster, kind, spec)  # the stream's lock: exclusive when fresh, else shared
        result = BatchResult(kind)
        stored = WatchCursor.objects.filter(cluster=cluster, kind=kind).values_list(
            "resource_version", flat=True
        )
        if stored and int(stored[0]) > list_resource_version:
            # The server went back in time (etcd restored, cluster rebuilt under the same name): our
            # rows may carry versions the server will never reach again, so the fence cannot apply.
            log.warning("%s/%s: list at %d is older than our cursor %d; replacing all", cluster.name, kind,
                        list_resource_version, int(stored[0]))  # fmt: skip
            records = list(records)
            all_keys = [
                tuple(k)
                for k in spec.model._default_manager.filter(cluster=cluster).values_list(*spec.natural_key)
            ]
            # Objects the list still has are rewritten below: for the history they never went away.
            listed_uids = {r.meta.uid for r in records}
            _delete_keys(cluster, spec, all_keys, observed_at, keep_history_of=listed_uids)
        if fresh:
            result.written = _upsert(cluster, spec, records, observed_at, fresh=True)
            count = len(result.written)  # every record: nothing stored to be newer
        else:
            listed = list(records)
            # Most of a relist is what is stored already, at the same resourceVersion (the same object): left
            # out before the upsert, so they cost one read of the versions instead of a staged row each. The
            # fence would skip them too (a concurrent writer is still ordered by it).
            stored_at = _stored_versions(cluster, spec)
            newer = [r for r in listed if stored_at.get(spec.key_of(r)) != r.meta.resource_version]
            result.written = _upsert(cluster, spec, newer, observed_at)
            count = len(listed)
        result.stale = count - len(result.written)
        result.resync = True
        if not fresh:  # else nothing was stored, so nothing can be absent from the list
            present = {spec.key_of(r) for r in listed}
            absent = [
                key
                for key in spec.model._default_manager.filter(
                    cluster=cluster, resource_version__lte=list_resource_version
                ).values_list(*spec.natural_key)
                if tuple(key) not in present
            ]
            # Deleted only if still not newer than the list when the DELETE runs (a watch batch may have
            # committed a newer version since the read above).
            result.deleted = _delete_keys(
                cluster, spec, [tuple(k) for k in absent], observed_at, max_version=list_resource_version
            )
        if cursor:
            _save_cursor(cluster, kind, CursorUpdate(list_resource_version, "watching", objects=count))
        _publish_on_commit(cluster, result)
    if fresh:
        _analyze(spec)
    return result


def _analyze(spec: TableSpec) -> None:
    """Refresh the planner's statistics of the kind's tables after an initial sync.

    Until autovacuum analyzes the new rows (a minute or more), the planner believes the tables nearly
    empty: the heatmap's read of a few changed pools then took 26 s for 100 pools and 251 s for 10 on the
    L fleet (0.02 s once analyzed), and the live feed stalled for the first minute of a new deployment.
    ANALYZE samples a fixed number of rows (about 0.1-0.5 s per large table) and blocks no reader or
    writer."""
    qn = connection.ops.quote_name
    tables = ", ".join(qn(m._meta.db_table) for m in (spec.model, *(c.model for c in spec.children)))
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {tables}")


def _stored_versions(cluster: Cluster, spec: TableSpec) -> dict[tuple[str, ...], Decimal]:
    """Natural key -> stored resourceVersion of every object of the kind in ``cluster`` (for replace_all)."""
    rows = spec.model._default_manager.filter(cluster=cluster).values_list(
        *spec.natural_key, "resource_version"
    )
    return {tuple(row[:-1]): row[-1] for row in rows}


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


def _json_text(value: Any) -> str:
    """A JSON column's value as JSON text: orjson (about 10x the stdlib's speed), and the stdlib's rules
    for what orjson refuses (integers beyond 64 bits, non-string keys), as Django's JSONField would."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


@dataclass(frozen=True)
class _Columns:
    """A model's columns in insert order, and which hold JSON."""

    fields: tuple[models.Field[Any, Any], ...]
    names: tuple[str, ...]
    attnames: tuple[str, ...]
    json: tuple[int, ...]  # positions of the JSON columns


_COLUMNS: dict[type[models.Model], _Columns] = {}


def _columns(model: type[models.Model]) -> _Columns:
    cols = _COLUMNS.get(model)
    if cols is None:
        fields = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
        cols = _Columns(
            fields=fields,
            names=tuple(str(f.column) for f in fields),
            attnames=tuple(f.attname for f in fields),
            json=tuple(i for i, f in enumerate(fields) if isinstance(f, models.JSONField)),
        )
        _COLUMNS[model] = cols
    return cols


def _prep(model: type[models.Model], rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Column names and each row's values as the database takes them.

    On PostgreSQL without Django's per-field ``get_db_prep_save`` (about a third of a large batch's time):
    every other column of the mirrored tables already holds what psycopg adapts itself (str, int, bool,
    Decimal, aware datetime, None), and JSON columns become JSON text, which COPY and ``%s::jsonb`` take
    as is. ``tests/db/test_ingest.py`` checks this against Django's preparation of the same rows."""
    cols = _columns(model)
    if connection.vendor != "postgresql":
        db = connections[DEFAULT_DB_ALIAS]  # resolved once: the proxy costs a lookup per access
        return list(cols.names), [
            [f.get_db_prep_save(row[f.attname], db) for f in cols.fields] for row in rows
        ]
    return list(cols.names), list(_prepared(cols, rows))


def _prepared(cols: _Columns, rows: Iterable[dict[str, Any]]) -> Iterator[list[Any]]:
    """PostgreSQL's values of ``rows``, one at a time: fed to COPY as they come, this work overlaps with
    the server's parsing of the rows already sent."""
    pick = itemgetter(*cols.attnames)
    for row in rows:
        vals = list(pick(row))
        for i in cols.json:
            vals[i] = _json_text(vals[i])
        yield vals


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
    json_cols = {_columns(model).names[i] for i in _columns(model).json}
    # JSON columns arrive as JSON text on PostgreSQL (see _prep): say so, or it is taken as text.
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    row = "(" + ", ".join(f"%s{cast}" if c in json_cols else "%s" for c in columns) + ")"
    sql = (
        f"INSERT INTO {table} ({', '.join(qn(c) for c in columns)}) VALUES {', '.join([row] * n_rows)}"
        + _conflict_sql(table, columns, conflict, fence, returning)
    )
    return sql


RESOURCE_VERSION = "resource_version"  # the fence column whose equal value means "the same object"


def _conflict_sql(
    table: str, columns: Sequence[str], conflict: Sequence[str], fence: str | None, returning: Sequence[str]
) -> str:
    qn = connection.ops.quote_name
    sql = ""
    if conflict:
        updates = ", ".join(f"{qn(c)} = excluded.{qn(c)}" for c in columns if c not in conflict)
        sql = f" ON CONFLICT ({', '.join(qn(c) for c in conflict)}) DO UPDATE SET {updates}"
    if fence and conflict:
        # The fence: never let an older version (resourceVersion, pool generation) overwrite a newer one.
        # An equal resourceVersion is the stored object itself (Kubernetes gives every write a new one), so
        # it is not rewritten either: a relist or a duplicate watch event that brings nothing new writes no
        # row, no children and no history, and publishes no change. An equal pool generation is not the same
        # row (a device moves between slices of one generation), so it passes.
        op = "<" if fence == RESOURCE_VERSION else "<="
        sql += f" WHERE {table}.{qn(fence)} {op} excluded.{qn(fence)}"
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


def _copy(cur: Any, table: str, columns: Sequence[str], values: Iterable[Sequence[Any]]) -> None:
    """``COPY table (columns) FROM STDIN`` of prepared rows (psycopg's C writer formats them)."""
    qn = connection.ops.quote_name
    with cur.copy(f"COPY {table} ({', '.join(qn(c) for c in columns)}) FROM STDIN") as copy:
        for row in values:
            copy.write_row(row)


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
    sql = f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {staging}" + _conflict_sql(
        table, columns, conflict, fence, returning
    )
    with connection.cursor() as cur:
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {staging} ON COMMIT DROP AS "
            f"SELECT {cols} FROM {table} WITH NO DATA"
        )
        cur.execute(f"TRUNCATE {staging}")
        _copy(cur.cursor, staging, columns, values)
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()] if returning else []


def _copy_insert(model: type[models.Model], rows: Iterable[dict[str, Any]]) -> None:
    """Plain COPY into the table (PostgreSQL): only for rows no stored row can conflict with (see
    _lock_if_fresh)."""
    cols = _columns(model)
    with connection.cursor() as cur:
        _copy(cur.cursor, connection.ops.quote_name(model._meta.db_table), cols.names, _prepared(cols, rows))


def write_rows(model: type[models.Model], rows: list[dict[str, Any]], conflict: Sequence[str] = ()) -> None:
    """Bulk-write rows of a table kept alongside the mirrored ones, inside an ingest transaction (claims'
    history hooks), the way ingest writes its own: constant statements per call, COPY for large batches
    on PostgreSQL, no per-field Django preparation (Django's ``bulk_create`` spends most of its time
    there). Each row maps every concrete column's attname but the primary key (``cluster_id``, not
    ``cluster``) to its value. ``conflict``: columns of a unique constraint whose existing row is
    updated with the new values (no fence); empty: plain inserts."""
    if not rows:
        return
    if not conflict and connection.vendor == "postgresql" and connection.in_atomic_block:
        _copy_insert(model, rows)
    else:
        _bulk_upsert(model, rows, conflict, fence=None)


def _stream_key(cluster: Cluster, kind: str) -> tuple[int, int]:
    """The advisory-lock key of a (cluster, kind): two int4, the cluster id and a stable hash of the kind."""
    return cluster.pk, zlib.crc32(kind.encode()) - 2**31


def _stream_lock(cluster: Cluster, kind: str, exclusive: bool) -> None:
    """Take the (cluster, kind) advisory lock for this transaction: shared for every ordinary batch, so
    writers of a stream never wait for each other (the fence orders them); exclusive for the initial-sync
    COPY, which must be the only writer of that cluster's rows of that kind. Other clusters and kinds never
    wait. PostgreSQL only; a no-op elsewhere (the demo's SQLite serializes writers anyway)."""
    if connection.vendor != "postgresql" or not connection.in_atomic_block:
        return
    fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    with connection.cursor() as cur:
        cur.execute(f"SELECT {fn}(%s, %s)", list(_stream_key(cluster, kind)))


def _lock_if_fresh(cluster: Cluster, kind: str, spec: TableSpec) -> bool:
    """Take the stream's lock for a relist; True when neither the kind's table nor its children's hold a
    row of ``cluster`` and no other writer of this stream can add one before this transaction commits.

    Then inserting the records is the upsert: no stored row to fence against, no old children to replace,
    nothing absent to delete; a plain COPY skips the staging table, the conflict checks and RETURNING.
    That is a cluster's initial sync, or a relist after everything was deleted. Every ingest transaction
    holds the (cluster, kind) advisory lock, shared; this one takes it exclusive only when a first look
    finds no row (and it is the first lock the transaction takes, so there is no upgrade to deadlock on),
    then looks again: a writer that committed before we got the lock makes it an ordinary relist. A writer
    waiting on us applies its batch after our commit, through the fence as usual. PostgreSQL only, inside
    the caller's transaction."""
    if connection.vendor != "postgresql" or not connection.in_atomic_block:
        return False
    qn = connection.ops.quote_name
    tables = [qn(m._meta.db_table) for m in (spec.model, *(c.model for c in spec.children))]
    probe = " OR ".join(f"EXISTS (SELECT 1 FROM {t} WHERE cluster_id = %s)" for t in tables)
    with connection.cursor() as cur:
        cur.execute(f"SELECT {probe}", [cluster.pk] * len(tables))
        if cur.fetchone()[0]:
            _stream_lock(cluster, kind, exclusive=False)
            return False
        _stream_lock(cluster, kind, exclusive=True)
        cur.execute(f"SELECT {probe}", [cluster.pk] * len(tables))  # what committed before the lock
        return not cur.fetchone()[0]


def _upsert(
    cluster: Cluster, spec: TableSpec, records: Iterable[Any], observed_at: datetime, fresh: bool = False
) -> list[tuple[str, ...]]:
    """Write records (and their children) through the fence; ``fresh``: the tables hold nothing of
    ``cluster`` and are locked (:func:`_lock_if_fresh`), so every record is written by a plain COPY,
    consuming ``records`` as it streams (a Sequence is needed otherwise)."""
    if not fresh and not records:
        return []
    now = timezone.now()
    consumed: list[Any] = []

    def rows() -> Iterator[dict[str, Any]]:
        for record in records:
            consumed.append(record)
            row = _common_row(record)
            row.update(spec.row(record))
            row["cluster_id"] = cluster.pk
            row["synced_at"] = now
            yield row

    written_records: list[Any]
    replaced_uids: list[str] = []
    if fresh:
        _copy_insert(spec.model, rows())
        written_records = consumed
        written = [spec.key_of(r) for r in consumed]
    else:
        assert isinstance(records, Sequence)
        conflict = ("cluster_id", *spec.natural_key)
        replaced = _replaced_uids(cluster, spec, records) if spec.children or spec.on_deleted else {}
        written = [
            tuple(r)
            for r in _bulk_upsert(
                spec.model, list(rows()), conflict, fence=RESOURCE_VERSION, returning=spec.natural_key
            )
        ]
        # Only a record that passed the fence replaces the stored object: a stale one (an old uid's late
        # event) must leave the newer object's children and history alone.
        replaced_uids = [replaced[k] for k in written if k in replaced]
        written_records = []
        if spec.children or spec.on_written:
            by_key = {spec.key_of(r): r for r in records}
            written_records = [by_key[k] for k in written]
    if (spec.children or spec.on_written) and written:
        if spec.on_deleted and replaced_uids:  # deleted and recreated under its name while unobserved
            spec.on_deleted(cluster, [(uid, None) for uid in replaced_uids], observed_at)
        if spec.on_written:
            spec.on_written(cluster, written_records, observed_at)
        for child in spec.children:
            if child.parent_field == "uid" and replaced_uids:
                # An object deleted and recreated under the same name: its old children go too.
                _delete_children_of(cluster, child, replaced_uids)
            _replace_children(cluster, child, written_records, fresh)
    return written


def _replaced_uids(cluster: Cluster, spec: TableSpec, records: Sequence[Any]) -> dict[tuple[str, ...], str]:
    """Natural key -> stored uid, where the batch has another uid under that key (if it gets written)."""
    new_uid = {spec.key_of(r): r.meta.uid for r in records}
    names = sorted({r.meta.name for r in records})
    qn = connection.ops.quote_name
    cols = ", ".join(qn(c) for c in (*spec.natural_key, "uid"))
    table = qn(spec.model._meta.db_table)
    old: dict[tuple[str, ...], str] = {}
    with connection.cursor() as cur:
        for where, params in _in_clauses("name", names):
            cur.execute(
                f"SELECT {cols} FROM {table} WHERE cluster_id = %s AND {where}", [cluster.pk, *params]
            )
            for row in cur.fetchall():
                key, uid = tuple(row[:-1]), row[-1]
                if key in new_uid and new_uid[key] != uid:
                    old[key] = uid
    return old


def _in_clauses(column: str, values: Sequence[Any]) -> Iterable[tuple[str, list[Any]]]:
    """``column`` among ``values`` as SQL conditions and their parameters: one ``= ANY(array)`` on
    PostgreSQL (a single parameter, where an IN list of 10,000 placeholders costs psycopg tens of
    milliseconds to parse), IN lists in chunks elsewhere."""
    qn = connection.ops.quote_name
    if not values:
        return
    if connection.vendor == "postgresql":
        yield f"{qn(column)} = ANY(%s)", [list(values)]
        return
    for chunk in _chunks(values, IN_CHUNK):
        yield f"{qn(column)} IN ({', '.join(['%s'] * len(chunk))})", list(chunk)


def _replace_children(cluster: Cluster, child: ChildSpec, parents: list[Any], fresh: bool = False) -> None:
    """Replace the children of ``parents``; ``fresh``: none is stored (see _lock_if_fresh), COPY them."""
    if not fresh:
        _delete_children_of(cluster, child, [child.parent_value(p) for p in parents])
    rows = []
    for parent in parents:
        for row in child.rows(parent):
            row["cluster_id"] = cluster.pk
            rows.append(row)
    rows = _dedupe(rows, child.conflict, child.fence)
    if fresh:
        _copy_insert(child.model, rows)
    else:
        _bulk_upsert(child.model, rows, ("cluster_id", *child.conflict), child.fence)


def _dedupe(rows: list[dict[str, Any]], key: Sequence[str], fence: str | None) -> list[dict[str, Any]]:
    """One row per key (PostgreSQL refuses to upsert a row twice in one statement): the newest wins."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        k = tuple(row[c] for c in key)
        if k not in seen or fence is None or row[fence] >= seen[k][fence]:
            seen[k] = row
    return list(seen.values())


def _delete_children_of(cluster: Cluster, child: ChildSpec, parent_values: Sequence[str]) -> None:
    table = connection.ops.quote_name(child.model._meta.db_table)
    with connection.cursor() as cur:
        for where, params in _in_clauses(child.parent_column, parent_values):
            cur.execute(f"DELETE FROM {table} WHERE cluster_id = %s AND {where}", [cluster.pk, *params])


def _delete(
    cluster: Cluster, spec: TableSpec, records: Sequence[Any], observed_at: datetime
) -> list[tuple[str, ...]]:
    """Delete objects named by DELETED events: only the same uid, and only if not newer than the event."""
    qn = connection.ops.quote_name
    table = qn(spec.model._meta.db_table)
    cols = [qn(c) for c in spec.natural_key]
    clause = " AND ".join(
        [f"{c} = %s" for c in cols] + [f"{qn('uid')} = %s", f"{qn('resource_version')} <= %s"]
    )
    returning = [*cols, qn("name"), qn("uid"), qn(str(spec.model._meta.pk.column))]
    n = len(cols)
    deleted: list[tuple[str, ...]] = []
    gone: list[str] = []
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
        _delete_dependents(spec.model, [r[n + 2] for r in rows])
        deleted.extend(tuple(r[:n]) for r in rows)
        gone.extend(r[n + 1] for r in rows)
    if spec.on_deleted and gone:
        at = {r.meta.uid: r.meta.deleted_at for r in records}
        spec.on_deleted(cluster, [(uid, at.get(uid)) for uid in gone], observed_at)
    return deleted


def _delete_keys(
    cluster: Cluster,
    spec: TableSpec,
    keys: list[tuple[str, ...]],
    observed_at: datetime,
    max_version: int | None = None,
    keep_history_of: Collection[str] = frozenset(),
) -> list[tuple[str, ...]]:
    """Delete objects by natural key (a relist no longer has them), in chunks; returns the keys deleted.

    ``max_version``: only objects not newer than this (the list's resourceVersion) go. ``keep_history_of``:
    uids not reported to the history hook (they are written again in the same transaction)."""
    manager = spec.model._default_manager
    gone: list[str] = []
    deleted: list[tuple[str, ...]] = []
    for chunk in _chunks(keys, OR_CHUNK):
        query = models.Q()
        for key in chunk:
            query |= models.Q(**dict(zip(spec.natural_key, key, strict=True)))
        doomed = manager.filter(models.Q(cluster=cluster) & query)
        if max_version is not None:
            doomed = doomed.filter(resource_version__lte=max_version)
        parents: dict[str, list[str]] = {"name": [], "uid": []}
        ids = []
        # FOR UPDATE: a row a concurrent batch made newer meanwhile is re-checked against max_version (and
        # skipped); a batch arriving after this waits, and re-inserts the object if it still exists.
        rows = doomed.select_for_update().values_list("pk", "name", "uid", *spec.natural_key)
        for pk, name, uid, *key in rows:
            ids.append(pk)
            parents["name"].append(name)
            parents["uid"].append(uid)
            deleted.append(tuple(key))
        manager.filter(pk__in=ids).delete()  # exactly the rows read (and locked) above
        _delete_children(cluster, spec, parents)
        gone.extend(parents["uid"])
    if spec.on_deleted:
        reported: list[tuple[str, datetime | None]] = [(u, None) for u in gone if u not in keep_history_of]
        if reported:
            spec.on_deleted(cluster, reported, observed_at)
    return deleted


def _delete_dependents(model: type[models.Model], pks: Sequence[Any]) -> None:
    """Delete rows of other tables whose foreign key to the deleted ``pks`` says CASCADE (a claim's stored
    diagnosis): the raw DELETE above skips Django's cascade, and the constraint would fail the whole batch
    at commit. Found through the model's relations, so fleet never names a claims model."""
    if not pks:
        return
    for rel in model._meta.related_objects:
        if rel.on_delete is models.CASCADE and isinstance(rel.field, models.ForeignKey):
            rel.related_model._default_manager.filter(**{f"{rel.field.name}__in": list(pks)}).delete()


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


def _save_cursor(cluster: Cluster, kind: str, cursor: CursorUpdate, forward_only: bool = False) -> None:
    """Save the stream's position. ``forward_only`` (watch batches): never move the cursor back. Two
    writers overlap when a worker was frozen or cut off longer than the lock's TTL and another took the
    stream over; the late one's batch must not make the next round resume from an older version (the
    rows have their own fence). A relist sets the position as listed: after a 410 the history may be new."""
    rv = Decimal(cursor.resource_version)
    defaults: dict[str, Any] = {"state": cursor.state, "last_event_at": timezone.now()}
    if cursor.objects is not None:
        defaults["object_count"] = cursor.objects
    position = Greatest(F("resource_version"), Value(rv, output_field=models.DecimalField()))
    WatchCursor.objects.update_or_create(
        cluster=cluster,
        kind=kind,
        defaults={**defaults, "resource_version": position if forward_only else rv},
        create_defaults={**defaults, "resource_version": rv},
    )


# ------------------------------------------------------------------------------------------- events


def _has_pool(model: type[models.Model]) -> bool:
    return {"driver", "pool"} <= {f.column for f in model._meta.concrete_fields}


def _child_pools(cluster: Cluster, spec: TableSpec, records: Sequence[Any]) -> set[tuple[str, str]] | None:
    """(driver, pool) of the stored rows with a pool of ``records``' objects: the objects' own (a slice,
    including one that publishes only counters and so has no device rows) and their children's (devices,
    allocations). Children of the records' own uid (or name), and of the object stored under each
    record's key (one deleted and recreated under its name while unobserved loses the old uid's
    children). One query per such table, whatever the batch size. Called before and after a batch's writes:
    the pools it can have changed."""
    pooled = [c for c in spec.children if _has_pool(c.model)]
    parent_pooled = _has_pool(spec.model)
    if not (pooled or parent_pooled) or not records:
        return set()
    if connection.vendor != "postgresql":
        return _child_pools_portable(cluster, spec, records, pooled, parent_pooled)
    qn = connection.ops.quote_name
    parent = qn(spec.model._meta.db_table)
    keys = [spec.key_of(r) for r in records]
    key_columns = ", ".join(f"p.{qn(c)}" for c in spec.natural_key)
    key_arrays = ", ".join("%s::text[]" for _ in spec.natural_key)
    by_key = f"p.cluster_id = %s AND ({key_columns}) IN (SELECT * FROM unnest({key_arrays}))"
    key_params: list[Any] = [cluster.pk, *([k[i] for k in keys] for i in range(len(spec.natural_key)))]
    out: set[tuple[str, str]] = set()
    with connection.cursor() as cur:
        if parent_pooled:
            cur.execute(f"SELECT p.driver, p.pool FROM {parent} p WHERE {by_key}", key_params)
            out.update((driver, pool) for driver, pool in cur.fetchall())
        for child in pooled:
            table, column = qn(child.model._meta.db_table), qn(child.parent_column)
            cur.execute(
                f"SELECT c.driver, c.pool FROM {table} c WHERE c.cluster_id = %s AND c.{column} = ANY(%s) "
                f"UNION SELECT c.driver, c.pool FROM {parent} p JOIN {table} c "
                f"ON c.cluster_id = p.cluster_id AND c.{column} = p.{qn(child.parent_field)} WHERE {by_key}",
                [cluster.pk, [child.parent_value(r) for r in records], *key_params],
            )
            out.update((driver, pool) for driver, pool in cur.fetchall())
    return out


def _child_pools_portable(
    cluster: Cluster, spec: TableSpec, records: Sequence[Any], pooled: list[ChildSpec], parent_pooled: bool
) -> set[tuple[str, str]]:
    """``_child_pools`` without PostgreSQL's unnest: the stored parents are read by name (chunked IN lists)
    and matched on their whole key here, then their children's pools by parent value."""
    qn = connection.ops.quote_name
    parent = qn(spec.model._meta.db_table)
    keys = {spec.key_of(r) for r in records}
    fields = sorted({c.parent_field for c in pooled})
    columns = [*spec.natural_key, *fields, *(("driver", "pool") if parent_pooled else ())]
    select = ", ".join(qn(c) for c in columns)
    n = len(spec.natural_key)
    parent_values: dict[str, set[str]] = {f: set() for f in fields}
    for child in pooled:
        parent_values[child.parent_field].update(child.parent_value(r) for r in records)
    out: set[tuple[str, str]] = set()
    with connection.cursor() as cur:
        for where, params in _in_clauses("name", sorted({k[-1] for k in keys})):
            cur.execute(
                f"SELECT {select} FROM {parent} WHERE cluster_id = %s AND {where}", [cluster.pk, *params]
            )
            for row in cur.fetchall():
                if tuple(row[:n]) not in keys:
                    continue
                for i, f in enumerate(fields):
                    parent_values[f].add(row[n + i])
                if parent_pooled:
                    out.add((row[-2], row[-1]))
        for child in pooled:
            table = qn(child.model._meta.db_table)
            for where, params in _in_clauses(child.parent_column, sorted(parent_values[child.parent_field])):
                cur.execute(
                    f"SELECT DISTINCT driver, pool FROM {table} WHERE cluster_id = %s AND {where}",
                    [cluster.pk, *params],
                )
                out.update((driver, pool) for driver, pool in cur.fetchall())
    return out


def change_event(cluster: Cluster, result: BatchResult) -> dict[str, Any]:
    """The event a committed batch publishes. Every event has "type", "cluster" and "kind" (all that the
    feed and the diagnosis trigger read). A watch batch names the keys it wrote and deleted ("written",
    "deleted": "name" or "namespace/name") and, when known, the pools whose devices or allocations it may
    have changed ("pools": [driver, pool] pairs, old and new; the heatmap re-reads only those); a relist
    says ``"resync": True`` with counts only ("written_count", "deleted_count"): listing tens of thousands
    of keys cost seconds to build and send, and a relist can change anything of its kind anyway."""
    event: dict[str, Any] = {"type": "fleet.change", "cluster": cluster.name, "kind": result.kind}
    if result.resync:
        event.update(resync=True, written_count=len(result.written), deleted_count=len(result.deleted))
    else:
        event["written"] = ["/".join(k) for k in result.written]
        event["deleted"] = ["/".join(k) for k in result.deleted]
        if result.pools is not None:
            event["pools"] = [list(p) for p in sorted(result.pools)]
    return event


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
    commit_counter.bump()  # first: a page that reads the new count must find the committed rows
    publish(event)
    for listener in _listeners:
        try:
            listener(event)
        except Exception as exc:  # a listener's failure must not undo or block ingestion
            name = getattr(listener, "__qualname__", repr(listener))
            commit_counter.log_failure(
                log, f"change listener {name} failed for {event['cluster']} {event['kind']}", exc
            )


def notify_imported(cluster: Cluster) -> None:
    """Tell the listeners that a whole import of ``cluster`` is written (``"imported": True``): what they
    derive from the fleet (diagnoses) is due now, not debounced, since the batches' own events may have
    been absorbed by a window that opened with the first of them."""
    _notify({"type": "fleet.change", "cluster": cluster.name, "kind": "", "imported": True})


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
    except Exception as exc:  # the database is the truth; a lost notification only delays a page update
        commit_counter.log_failure(
            log, f"could not publish change events for {event['cluster']} {event['kind']}", exc
        )


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
            "tainted": counts.is_tainted(d.taints),
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
