"""The general SQL writer: bulk upserts through a fence, COPY for large batches, chunked parameter lists.

A constant number of statements per table, whatever the batch size (up to the database's parameter limit
per statement)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import orjson
from django.db import DEFAULT_DB_ALIAS, connection, connections, models

OR_CHUNK = 500  # keys per OR-chained DELETE: under SQLite's expression depth limit (1000)
IN_CHUNK = 10_000  # values per IN list: under both backends' bound-parameter limits


def chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _max_rows(columns: int) -> int:
    """Rows per statement under the backend's bound-parameter limit (SQLite 32766, PostgreSQL 65535)."""
    limit = 32000 if connection.vendor == "sqlite" else 65000
    return max(1, limit // columns)


def json_text(value: Any) -> str:
    """A JSON column's value as JSON text: orjson (about 10x the stdlib's speed), and the stdlib's rules
    for what orjson refuses (integers beyond 64 bits, non-string keys), as Django's JSONField would."""
    if not value:
        # Empty lists and maps are a large part of the values a sync writes (taints, labels, consumed
        # counters): their text without a call to orjson and a decode.
        empty = _EMPTY_JSON.get(type(value))
        if empty is not None:
            return empty
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


_EMPTY_JSON: dict[type, str] = {list: "[]", dict: "{}", type(None): "null"}


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


def prep(model: type[models.Model], rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Column names and each row's values as the database takes them.

    On PostgreSQL without Django's per-field ``get_db_prep_save`` (about a third of a large batch's time):
    every other column of the mirrored tables already holds what psycopg adapts itself (str, int, bool,
    Decimal, aware datetime, None), and JSON columns become JSON text, which COPY and ``%s::jsonb`` (or
    ``::json``) take as is. ``tests/db/test_ingest.py`` checks this against Django's preparation of the
    same rows."""
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
            vals[i] = json_text(vals[i])
        yield vals


def _insert_sql(
    model: type[models.Model],
    columns: list[str],
    n_rows: int,
    conflict: Sequence[str],
    fence: str | None,
    returning: Sequence[str],
    keep: Sequence[str] = (),
) -> str:
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    cols = _columns(model)
    # JSON columns arrive as JSON text on PostgreSQL (see prep): say so, or it is taken as text; in their
    # own type (json or jsonb, fleet.models.TextJSONField), else the server converts each value.
    casts = (
        {cols.names[i]: f"::{cols.fields[i].db_type(connection)}" for i in cols.json}
        if connection.vendor == "postgresql"
        else dict.fromkeys((cols.names[i] for i in cols.json), "")
    )
    row = "(" + ", ".join(f"%s{casts[c]}" if c in casts else "%s" for c in columns) + ")"
    sql = (
        f"INSERT INTO {table} ({', '.join(qn(c) for c in columns)}) VALUES {', '.join([row] * n_rows)}"
        + conflict_sql(table, columns, conflict, fence, returning, keep)
    )
    return sql


RESOURCE_VERSION = "resource_version"  # the fence column whose equal value means "the same object"


def conflict_sql(
    table: str,
    columns: Sequence[str],
    conflict: Sequence[str],
    fence: str | None,
    returning: Sequence[str],
    keep: Sequence[str] = (),
) -> str:
    """The ``ON CONFLICT`` clause of an upsert: every column but ``conflict``'s and ``keep``'s is set from
    the new row. ``keep``: columns the caller read as equal to the new row's: left out of ``SET``, and a
    stored row that differs in them now is not updated (nor returned), so the caller can write it again
    with them. Naming a column of a unique constraint in ``SET`` makes PostgreSQL lock the row FOR
    UPDATE, which waits for the foreign-key checks of rows pointing to it (KEY SHARE); left out, it locks
    FOR NO KEY UPDATE, which does not."""
    qn = connection.ops.quote_name
    sql = ""
    if conflict:
        updates = ", ".join(
            f"{qn(c)} = excluded.{qn(c)}" for c in columns if c not in conflict and c not in keep
        )
        sql = f" ON CONFLICT ({', '.join(qn(c) for c in conflict)}) DO UPDATE SET {updates}"
    conditions = [f"{table}.{qn(c)} = excluded.{qn(c)}" for c in keep] if conflict else []
    if fence and conflict:
        # The fence: never let an older version (resourceVersion, pool generation) overwrite a newer one.
        # An equal resourceVersion is the stored object itself (Kubernetes gives every write a new one), so
        # it is not rewritten either: a relist or a duplicate watch event that brings nothing new writes no
        # row, no children and no history, and publishes no change. An equal pool generation is not the same
        # row (a device moves between slices of one generation), so it passes.
        op = "<" if fence == RESOURCE_VERSION else "<="
        conditions.insert(0, f"{table}.{qn(fence)} {op} excluded.{qn(fence)}")
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    if returning:
        sql += " RETURNING " + ", ".join(qn(c) for c in returning)
    return sql


def bulk_upsert(
    model: type[models.Model],
    rows: list[dict[str, Any]],
    conflict: Sequence[str],
    fence: str | None,
    returning: Sequence[str] = (),
    keep: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    """Insert ``rows``, updating the stored row of the same ``conflict`` columns (behind ``fence``, all
    columns but ``keep``, see :func:`conflict_sql`); returns the ``returning`` columns of the rows
    written."""
    if not rows:
        return []
    columns, values = prep(model, rows)
    if connection.vendor == "postgresql" and len(values) >= COPY_ROWS and connection.in_atomic_block:
        return _copy_upsert(model, columns, values, conflict, fence, returning, keep)
    out: list[tuple[Any, ...]] = []
    step = _max_rows(len(columns))
    with connection.cursor() as cur:
        for start in range(0, len(values), step):
            chunk = values[start : start + step]
            sql = _insert_sql(model, columns, len(chunk), conflict, fence, returning, keep)
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
    keep: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    """The same upsert (conflict rule, fence, RETURNING) for large batches on PostgreSQL: COPY the rows
    into a temporary table, then one INSERT ... SELECT. Client-side placeholder handling of the VALUES
    form costs more than the database's work at this size. Call inside a transaction."""
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    staging = qn(f"ingest_{model._meta.db_table}")
    cols = ", ".join(qn(c) for c in columns)
    sql = f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {staging}" + conflict_sql(
        table, columns, conflict, fence, returning, keep
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


def copy_insert(model: type[models.Model], rows: Iterable[dict[str, Any]]) -> None:
    """Plain COPY into the table (PostgreSQL): only for rows no stored row can conflict with (see
    lock_if_fresh)."""
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
        copy_insert(model, rows)
    else:
        bulk_upsert(model, rows, conflict, fence=None)


def in_clauses(column: str, values: Sequence[Any]) -> Iterable[tuple[str, list[Any]]]:
    """``column`` among ``values`` as SQL conditions and their parameters: one ``= ANY(array)`` on
    PostgreSQL (a single parameter, where an IN list of 10,000 placeholders costs psycopg tens of
    milliseconds to parse), IN lists in chunks elsewhere."""
    qn = connection.ops.quote_name
    if not values:
        return
    if connection.vendor == "postgresql":
        yield f"{qn(column)} = ANY(%s)", [list(values)]
        return
    for chunk in chunks(values, IN_CHUNK):
        yield f"{qn(column)} IN ({', '.join(['%s'] * len(chunk))})", list(chunk)


def key_clauses(columns: Sequence[str], keys: Collection[tuple[str, ...]]) -> Iterable[tuple[str, list[Any]]]:
    """Rows whose ``columns`` (a natural key ending in the name) equal one of ``keys``, as SQL conditions
    and their parameters. On PostgreSQL one condition on the whole key (an unnest of one array per
    column), which the (cluster, namespace, name) index answers key by key: a condition on the name
    alone scans every row of the cluster against the array (0.3 s per batch of 200 claims at 40,000
    claims). Elsewhere the names in IN lists: the caller keeps the rows whose whole key it asked for."""
    qn = connection.ops.quote_name
    if not keys:
        return
    if connection.vendor == "postgresql":
        cols = ", ".join(qn(c) for c in columns)
        arrays = ", ".join("%s::text[]" for _ in columns)
        listed = list(keys)
        yield (
            f"({cols}) IN (SELECT * FROM unnest({arrays}))",
            [[k[i] for k in listed] for i in range(len(columns))],
        )
        return
    yield from in_clauses(columns[-1], sorted({k[-1] for k in keys}))


def dedupe(rows: list[dict[str, Any]], key: Sequence[str], fence: str | None) -> list[dict[str, Any]]:
    """One row per key (PostgreSQL refuses to upsert a row twice in one statement): the newest wins."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        k = tuple(row[c] for c in key)
        if k not in seen or fence is None or row[fence] >= seen[k][fence]:
            seen[k] = row
    return list(seen.values())
