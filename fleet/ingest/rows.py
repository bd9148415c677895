"""Writing and deleting the records of one kind and their child rows (devices, allocations), through the
resourceVersion fence."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import connection, models
from django.utils import timezone

from fleet.ingest.specs import ChildSpec, TableSpec
from fleet.ingest.sql import (
    OR_CHUNK,
    RESOURCE_VERSION,
    bulk_upsert,
    chunks,
    copy_insert,
    dedupe,
    in_clauses,
    key_clauses,
)
from fleet.models import Cluster


def upsert(
    cluster: Cluster, spec: TableSpec, records: Iterable[Any], observed_at: datetime, fresh: bool = False
) -> list[tuple[str, ...]]:
    """Write records (and their children) through the fence; ``fresh``: the tables hold nothing of
    ``cluster`` and are locked (:func:`lock_if_fresh`), so every record is written by a plain COPY,
    consuming ``records`` as it streams (a Sequence is needed otherwise)."""
    if not fresh and not records:
        return []
    now = timezone.now()
    consumed: list[Any] = []

    def rows(records: Iterable[Any]) -> Iterator[dict[str, Any]]:
        for record in records:
            consumed.append(record)
            row = common_row(record)
            row.update(spec.row(record))
            row["cluster_id"] = cluster.pk
            row["synced_at"] = now
            yield row

    written_records: list[Any]
    replaced_uids: list[str] = []
    if fresh:
        copy_insert(spec.model, rows(records))
        written_records = consumed
        written = [spec.key_of(r) for r in consumed]
    else:
        assert isinstance(records, Sequence)
        conflict = ("cluster_id", *spec.natural_key)
        checked = bool(spec.children or spec.on_deleted)
        stored = _stored_uids(cluster, spec, records) if checked else {}
        keyed = [(spec.key_of(r), r) for r in records]
        new_uid = {key: r.meta.uid for key, r in keyed}  # a key's last record is the one written
        replaced = {key: uid for key, uid in stored.items() if uid != new_uid[key]}
        # Where the stored uid was read as the record's, it is left out of the update: a uid is a key
        # column, and naming it would lock the row FOR UPDATE, which waits for (and can deadlock with) the
        # foreign-key checks of rows pointing to it, such as the diagnosis's (bench_e2e, L: a watch batch
        # aborted about once a run, its stream listing again). A row whose uid another writer changed
        # since is left by that statement (``keep``) and written with the rest, uid included.
        same = [r for key, r in keyed if stored.get(key) == r.meta.uid]
        written = [
            tuple(r)
            for r in bulk_upsert(
                spec.model, list(rows(same)), conflict, RESOURCE_VERSION, spec.natural_key, keep=("uid",)
            )
        ]
        done = set(written)
        other = [r for key, r in keyed if stored.get(key) != r.meta.uid or key not in done]
        written += [
            tuple(r)
            for r in bulk_upsert(spec.model, list(rows(other)), conflict, RESOURCE_VERSION, spec.natural_key)
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


def _stored_uids(cluster: Cluster, spec: TableSpec, records: Sequence[Any]) -> dict[tuple[str, ...], str]:
    """Natural key -> stored uid, of the batch's keys that are stored."""
    keys = {spec.key_of(r) for r in records}
    qn = connection.ops.quote_name
    cols = ", ".join(qn(c) for c in (*spec.natural_key, "uid"))
    table = qn(spec.model._meta.db_table)
    out: dict[tuple[str, ...], str] = {}
    with connection.cursor() as cur:
        for where, params in key_clauses(spec.natural_key, keys):
            cur.execute(
                f"SELECT {cols} FROM {table} WHERE cluster_id = %s AND {where}", [cluster.pk, *params]
            )
            for row in cur.fetchall():
                key = tuple(row[:-1])
                if key in keys:
                    out[key] = row[-1]
    return out


def _replace_children(cluster: Cluster, child: ChildSpec, parents: list[Any], fresh: bool = False) -> None:
    """Replace the children of ``parents``; ``fresh``: none is stored (see lock_if_fresh), COPY them."""
    if not fresh:
        _delete_children_of(cluster, child, [child.parent_value(p) for p in parents])
    rows = []
    for parent in parents:
        for row in child.rows(parent):
            row["cluster_id"] = cluster.pk
            rows.append(row)
    rows = dedupe(rows, child.conflict, child.fence)
    if fresh:
        copy_insert(child.model, rows)
    else:
        bulk_upsert(child.model, rows, ("cluster_id", *child.conflict), child.fence)


def _delete_children_of(cluster: Cluster, child: ChildSpec, parent_values: Sequence[str]) -> None:
    table = connection.ops.quote_name(child.model._meta.db_table)
    with connection.cursor() as cur:
        for where, params in in_clauses(child.parent_column, parent_values):
            cur.execute(f"DELETE FROM {table} WHERE cluster_id = %s AND {where}", [cluster.pk, *params])


def delete(
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
    for chunk in chunks(records, OR_CHUNK):
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


def delete_keys(
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
    for chunk in chunks(keys, OR_CHUNK):
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


def common_row(record: Any) -> dict[str, Any]:
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
