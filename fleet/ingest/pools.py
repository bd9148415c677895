"""Pool discovery: the (driver, pool) pairs whose devices or allocations a batch may change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, models

from fleet.ingest.specs import ChildSpec, TableSpec
from fleet.ingest.sql import IN_CHUNK, chunks, in_clauses, key_clauses
from fleet.models import Cluster


def has_pool(model: type[models.Model]) -> bool:
    return {"driver", "pool"} <= {f.column for f in model._meta.concrete_fields}


def pooled(spec: TableSpec) -> bool:
    """Whether the kind's rows or its children's name a pool (slices and devices, allocations)."""
    return has_pool(spec.model) or any(has_pool(c.model) for c in spec.children)


def names_devices(spec: TableSpec) -> bool:
    """Whether every row with a pool of the kind names one device (a claim's allocations): a batch of it
    changes who holds some devices, never the devices themselves (see :func:`child_devices`)."""
    pooled = [c for c in spec.children if has_pool(c.model)]
    return (
        bool(pooled)
        and not has_pool(spec.model)
        and all("device_name" in {f.column for f in c.model._meta.concrete_fields} for c in pooled)
    )


def child_pools(cluster: Cluster, spec: TableSpec, records: Sequence[Any]) -> set[tuple[str, str]]:
    """(driver, pool) of the stored rows with a pool of ``records``' objects: the objects' own (a slice,
    including one that publishes only counters and so has no device rows) and their children's (devices,
    allocations). Children of the records' own uid (or name), and of the object stored under each
    record's key (one deleted and recreated under its name while unobserved loses the old uid's
    children). One query per such table, whatever the batch size. Called before and after a batch's writes:
    the pools it can have changed."""
    return {(row[0], row[1]) for row in _child_rows(cluster, spec, records, POOL_COLUMNS)}


def child_devices(cluster: Cluster, spec: TableSpec, records: Sequence[Any]) -> set[tuple[str, str, str]]:
    """(driver, pool, device) named by the stored children of ``records``' objects, found as
    :func:`child_pools` finds their pools; for a kind that :func:`names_devices` only."""
    if not names_devices(spec):
        raise ValueError(f"{spec.model.__name__} rows do not name devices")
    return {(row[0], row[1], row[2]) for row in _child_rows(cluster, spec, records, DEVICE_COLUMNS)}


def pools_and_devices(
    cluster: Cluster, spec: TableSpec, records: Sequence[Any]
) -> tuple[set[tuple[str, str]], set[tuple[str, str, str]]]:
    """:func:`child_pools`, and :func:`child_devices` for a kind that :func:`names_devices` (else none),
    with one query per table: the pools are those of the devices then."""
    if not names_devices(spec):
        return child_pools(cluster, spec, records), set()
    devices = child_devices(cluster, spec, records)
    return {(driver, pool) for driver, pool, _ in devices}, devices


POOL_COLUMNS = ("driver", "pool")
DEVICE_COLUMNS = ("driver", "pool", "device_name")


def _child_rows(
    cluster: Cluster, spec: TableSpec, records: Sequence[Any], columns: tuple[str, ...]
) -> set[tuple[str, ...]]:
    """``columns`` of the rows :func:`child_pools` reads (the parent's own pool only with POOL_COLUMNS)."""
    pooled = [c for c in spec.children if has_pool(c.model)]
    parent_pooled = has_pool(spec.model)
    if not (pooled or parent_pooled) or not records:
        return set()
    if connection.vendor != "postgresql":
        return _child_rows_portable(cluster, spec, records, pooled, parent_pooled, columns)
    qn = connection.ops.quote_name
    parent = qn(spec.model._meta.db_table)
    keys = [spec.key_of(r) for r in records]
    key_columns = ", ".join(f"p.{qn(c)}" for c in spec.natural_key)
    key_arrays = ", ".join("%s::text[]" for _ in spec.natural_key)
    by_key = f"p.cluster_id = %s AND ({key_columns}) IN (SELECT * FROM unnest({key_arrays}))"
    key_params: list[Any] = [cluster.pk, *([k[i] for k in keys] for i in range(len(spec.natural_key)))]
    selected = ", ".join(f"c.{qn(c)}" for c in columns)
    out: set[tuple[str, ...]] = set()
    with connection.cursor() as cur:
        if parent_pooled:
            cur.execute(f"SELECT p.driver, p.pool FROM {parent} p WHERE {by_key}", key_params)
            out.update(tuple(row) for row in cur.fetchall())
        for child in pooled:
            table, column = qn(child.model._meta.db_table), qn(child.parent_column)
            cur.execute(
                f"SELECT {selected} FROM {table} c WHERE c.cluster_id = %s AND c.{column} = ANY(%s) "
                f"UNION SELECT {selected} FROM {parent} p JOIN {table} c "
                f"ON c.cluster_id = p.cluster_id AND c.{column} = p.{qn(child.parent_field)} WHERE {by_key}",
                [cluster.pk, [child.parent_value(r) for r in records], *key_params],
            )
            out.update(tuple(row) for row in cur.fetchall())
    return out


def _child_rows_portable(
    cluster: Cluster,
    spec: TableSpec,
    records: Sequence[Any],
    pooled: list[ChildSpec],
    parent_pooled: bool,
    columns: tuple[str, ...],
) -> set[tuple[str, ...]]:
    """``_child_rows`` without PostgreSQL's unnest: the stored parents are read by name (chunked IN lists)
    and matched on their whole key here, then their children's pools by parent value."""
    qn = connection.ops.quote_name
    parent = qn(spec.model._meta.db_table)
    keys = {spec.key_of(r) for r in records}
    fields = sorted({c.parent_field for c in pooled})
    parent_columns = [*spec.natural_key, *fields, *(("driver", "pool") if parent_pooled else ())]
    select = ", ".join(qn(c) for c in parent_columns)
    n = len(spec.natural_key)
    parent_values: dict[str, set[str]] = {f: set() for f in fields}
    for child in pooled:
        parent_values[child.parent_field].update(child.parent_value(r) for r in records)
    out: set[tuple[str, ...]] = set()
    selected = ", ".join(qn(c) for c in columns)
    with connection.cursor() as cur:
        for where, params in in_clauses("name", sorted({k[-1] for k in keys})):
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
            for where, params in in_clauses(child.parent_column, sorted(parent_values[child.parent_field])):
                cur.execute(
                    f"SELECT DISTINCT {selected} FROM {table} WHERE cluster_id = %s AND {where}",
                    [cluster.pk, *params],
                )
                out.update(tuple(row) for row in cur.fetchall())
    return out


def stored_pools(cluster: Cluster, spec: TableSpec, keys: Sequence[tuple[str, ...]]) -> set[tuple[str, str]]:
    """(driver, pool) of the stored objects of the kind under ``keys`` and of their children: what a relist
    is about to delete. A query per chunk of names and per pooled child table."""
    wanted = set(keys)
    fields = ["name", "uid", *(("driver", "pool") if has_pool(spec.model) else ())]
    found: list[dict[str, Any]] = []
    manager = spec.model._default_manager
    for where, params in key_clauses(spec.natural_key, wanted):
        rows = manager.filter(cluster=cluster).extra(where=[where], params=params)
        for row in rows.values(*spec.natural_key, *fields):
            if tuple(row[c] for c in spec.natural_key) in wanted:
                found.append(row)
    out: set[tuple[str, str]] = set()
    if has_pool(spec.model):
        out.update((row["driver"], row["pool"]) for row in found)
    for child in spec.children:
        if not has_pool(child.model):
            continue
        values = sorted({row[child.parent_field] for row in found})
        for chunk in chunks(values, IN_CHUNK):
            children = child.model._default_manager.filter(
                cluster=cluster, **{f"{child.parent_column}__in": list(chunk)}
            )
            out.update(children.values_list("driver", "pool").distinct())
    return out
