"""The only writer of the usage tables: one sampling round per call, in one transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any

from django.db import connection, transaction
from django.db.models import Model

from fleet.ingest import write_rows
from fleet.models import Cluster
from usage.cells import gpu_cells
from usage.cells import store as store_cells
from usage.join import DeviceInfo, DeviceRef, JoinResult
from usage.models import ClaimUsage, DeviceUsage, SamplingState, UsageTrend


@dataclass(frozen=True)
class Thresholds:
    """Idle = held and activity below ``below`` (0..1) for at least ``window``; ``interval`` is the
    sampling period (a longer silence between rounds counts at most two periods)."""

    below: float
    window: timedelta
    interval: timedelta


Holding = tuple[str, str]  # namespace, claim name


def record_failure(cluster: Cluster, at: datetime, error: str) -> None:
    """A round that could not read its source: keep every stored value, remember since when."""
    with transaction.atomic():
        state, _ = SamplingState.objects.select_for_update().get_or_create(cluster=cluster)
        state.last_round_at = at
        state.last_error = error[:2000]
        state.unavailable_since = state.unavailable_since or at
        state.save()


# ClaimUsage's values that a round carries over from the holding's previous row.
_CARRIED = (
    "first_seen",
    "last_seen",
    "samples",
    "gap_samples",
    "active_sum",
    "observed_seconds",
    "idle_seconds",
    "idle_since",
    "node",
    "model",
    "profile",
    "gpu_fraction",
)
_HOLDING_KEY = ("namespace", "claim", "driver", "pool", "device")
WRITE_CHUNK = 5000  # rows per COPY: large enough for COPY's speed, small enough to bound memory
CLAIM_CHUNK = 500  # claim names per IN list: far under SQLite's bound-parameter limit on any fleet size
HoldingKey = tuple[str, str, str, str, str]  # namespace, claim, driver, pool, device


def previous_holdings(cluster: Cluster, claims: Iterable[str]) -> dict[HoldingKey, dict[str, Any]]:
    """The stored accounting of these claims' holdings, by (namespace, claim, driver, pool, device), read
    as plain values (no model instances), a chunk of claim names per query."""
    names = sorted(set(claims))
    out: dict[HoldingKey, dict[str, Any]] = {}
    if connection.vendor == "postgresql":
        for start in range(0, len(names), CLAIM_CHUNK):
            out.update(_previous_postgresql(cluster.pk, names[start : start + CLAIM_CHUNK]))
        return out
    for start in range(0, len(names), CLAIM_CHUNK):
        rows = ClaimUsage.objects.filter(cluster=cluster, claim__in=names[start : start + CLAIM_CHUNK])
        for row in rows.values(*_HOLDING_KEY, *_CARRIED):
            out[(row["namespace"], row["claim"], row["driver"], row["pool"], row["device"])] = row
    return out


_TIMES = ("first_seen", "last_seen", "idle_since")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _previous_postgresql(cluster_id: int, names: list[str]) -> dict[HoldingKey, dict[str, Any]]:
    """``previous_holdings`` of some claims on PostgreSQL, the timestamps read as integer microseconds
    since the epoch (exact) and turned into datetimes here: Django's timestamp loader, a Python function
    per value, was most of the read's time on 50,000 timestamps."""
    table = connection.ops.quote_name(ClaimUsage._meta.db_table)
    rest = [name for name in _CARRIED if name not in _TIMES]
    micros = ", ".join(f"(EXTRACT(EPOCH FROM {name}) * 1000000)::bigint" for name in _TIMES)
    sql = (
        f"SELECT {', '.join(_HOLDING_KEY)}, {micros}, {', '.join(rest)} FROM {table} "
        "WHERE cluster_id = %s AND claim = ANY(%s)"
    )
    out: dict[HoldingKey, dict[str, Any]] = {}
    keys = len(_HOLDING_KEY)
    with connection.cursor() as cursor:
        cursor.execute(sql, [cluster_id, names])
        for row in cursor.fetchall():
            values = dict(zip(rest, row[keys + len(_TIMES) :], strict=True))
            for name, n in zip(_TIMES, row[keys : keys + len(_TIMES)], strict=True):
                values[name] = None if n is None else _EPOCH + timedelta(microseconds=n)
            out[row[:keys]] = values
    return out


def record_round(
    cluster: Cluster,
    at: datetime,
    result: JoinResult,
    devices: Sequence[DeviceInfo],
    held: Mapping[DeviceRef, Sequence[Holding]],
    limits: Thresholds,
    query_seconds: float,
    round_seconds: float,
) -> None:
    """Store a round: every measured or held device's latest values (a held device without a value is a
    gap: ``active`` null), each holding's idle accounting, the trend points and the sampling state.

    Rows are written as tuples by a binary COPY on PostgreSQL (:func:`_write`): at 60,000 devices,
    Django's ``bulk_create`` spent seconds preparing fields one by one, and the text COPY of dicts still
    most of a second."""
    info = {d.ref: d for d in devices}
    cluster_id = cluster.pk  # once: a model's pk is a property, read for each of 86,000 rows at L
    with transaction.atomic():
        # Every holding of the claims held now, however long ago it was last seen (a Prometheus outage
        # must not restart a holding's accounting).
        previous = previous_holdings(cluster, (claim for owners in held.values() for _, claim in owners))
        DeviceUsage.objects.filter(cluster=cluster).delete()
        rows: list[tuple[Any, ...]] = []
        holdings: list[dict[str, Any]] = []
        pick = itemgetter(*(name for name, _ in _CLAIM_USAGE))
        idle: dict[DeviceRef, datetime] = {}
        trend: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        measured = result.measured
        for ref, m in measured.items():
            if ref in held:
                continue
            # Nobody holds it: its values only (the columns follow ``Measured``'s order).
            rows.append((cluster_id, *ref, *m[1:], "", "", at, None))
            if len(rows) >= WRITE_CHUNK:  # written as they come: a round's rows never all in memory
                _write(DeviceUsage, _DEVICE_USAGE, rows)
                rows = []
        for ref, owners in held.items():
            value = measured.get(ref)
            d = info.get(ref)
            active = value.active if value else None
            starts: list[datetime | None] = []
            for namespace, claim in owners:
                h = previous.get((namespace, claim, *ref))
                holding = account(cluster_id, at, ref, d, namespace, claim, active, h, limits)
                holdings.append(holding)
                starts.append(holding["idle_since"])
                if d is not None:
                    point = trend[(d.model, namespace)]
                    share = d.gpu_fraction / len(owners)
                    point[0] += share
                    if active is not None:
                        point[1] += share
                        point[2] += share * active
                        since = holding["idle_since"]
                        if since is not None and at - since >= limits.window:
                            point[3] += share
            namespace, claim = owners[0] if owners else ("", "")
            # A shared device is idle while every holder's stretch is: since the latest start.
            idle_since = max(t for t in starts if t) if starts and None not in starts else None
            if idle_since is not None:
                idle[ref] = idle_since
            if value is not None:
                rows.append((cluster_id, *ref, *value[1:], namespace, claim, at, idle_since))
            else:  # held, no value this round: a gap
                gap = ("", d.gpu_uuid if d else "", "", None, None, None, None)
                rows.append((cluster_id, *ref, *gap, namespace, claim, at, idle_since))
            if len(rows) >= WRITE_CHUNK:
                _write(DeviceUsage, _DEVICE_USAGE, rows)
                rows = []
            if len(holdings) >= WRITE_CHUNK:
                _write(ClaimUsage, _CLAIM_USAGE, [pick(h) for h in holdings], _HOLDING_CONFLICT)
                holdings = []
        _write(DeviceUsage, _DEVICE_USAGE, rows)
        _write(ClaimUsage, _CLAIM_USAGE, [pick(h) for h in holdings], _HOLDING_CONFLICT)
        minute = at.replace(second=0, microsecond=0)
        UsageTrend.objects.bulk_create(
            [
                UsageTrend(
                    time=minute,
                    cluster=cluster,
                    model=model,
                    namespace=namespace,
                    allocated=v[0],
                    measured=v[1],
                    active=v[2],
                    idle=v[3],
                )
                for (model, namespace), v in sorted(trend.items())
            ],
            update_conflicts=True,
            unique_fields=["cluster", "model", "namespace", "resolution", "time"],
            update_fields=["allocated", "measured", "active", "idle"],
        )
        cells = gpu_cells(
            cluster.name,
            devices,
            {ref: m.active for ref, m in result.measured.items()},
            idle,
            at,
            limits.window,
        )
        transaction.on_commit(lambda: store_cells(cluster, cells, at))
        state, _ = SamplingState.objects.select_for_update().get_or_create(cluster=cluster)
        state.last_round_at = state.last_ok_at = at
        state.unavailable_since = None
        state.last_error = ""
        state.series = result.series
        state.matched = len(result.measured)
        state.unmatched = dict(result.unmatched)
        state.unmatched_examples = result.examples
        state.query_seconds = query_seconds
        state.round_seconds = round_seconds
        state.save()


_HOLDING_CONFLICT = ("cluster_id", "namespace", "claim", "driver", "pool", "device")

# The columns a round writes, in the order of its row tuples, with their PostgreSQL types (binary COPY
# sends each value in its column's binary form, so the types must be the columns' own).
_DEVICE_USAGE = (
    ("cluster_id", "int8"),
    ("driver", "text"),
    ("pool", "text"),
    ("device", "text"),
    # ``usage.join.Measured``'s values, in its order
    ("matched_by", "text"),
    ("gpu_uuid", "text"),
    ("instance_id", "text"),
    ("active", "float8"),
    ("fb_used_bytes", "int8"),
    ("fb_total_bytes", "int8"),
    ("power_watts", "float8"),
    ("namespace", "text"),
    ("claim", "text"),
    ("sampled_at", "timestamptz"),
    ("idle_since", "timestamptz"),
)
_CLAIM_USAGE = (
    ("cluster_id", "int8"),
    ("namespace", "text"),
    ("claim", "text"),
    ("driver", "text"),
    ("pool", "text"),
    ("device", "text"),
    ("node", "text"),
    ("model", "text"),
    ("profile", "text"),
    ("gpu_fraction", "float8"),
    ("first_seen", "timestamptz"),
    ("last_seen", "timestamptz"),
    ("samples", "int4"),
    ("gap_samples", "int4"),
    ("active_sum", "float8"),
    ("observed_seconds", "float8"),
    ("idle_seconds", "float8"),
    ("idle_since", "timestamptz"),
)


def _write(
    model: type[Model],
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[Any]],
    conflict: Sequence[str] = (),
) -> None:
    """Write rows (tuples in ``columns``' order) of a usage table; ``conflict``: the unique columns
    whose stored row is updated instead.

    PostgreSQL: a binary ``COPY`` (into a staging table for an upsert), hand-written rather than
    ``fleet.ingest.write_rows`` because psycopg dumps each value of a text COPY through a lookup of its
    Python type; with the column types given and the binary format, a round's 86,000 rows take a tenth of
    the time. Other databases: ``write_rows`` of the same values."""
    if not rows:
        return
    names = [name for name, _ in columns]
    if connection.vendor != "postgresql":
        write_rows(model, [dict(zip(names, row, strict=True)) for row in rows], conflict=conflict)
        return
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    cols = ", ".join(qn(name) for name in names)
    with connection.cursor() as cursor:
        target = table
        if conflict:
            target = qn(f"staging_{model._meta.db_table}")
            cursor.execute(
                f"CREATE TEMP TABLE IF NOT EXISTS {target} ON COMMIT DROP AS "
                f"SELECT {cols} FROM {table} WITH NO DATA"
            )
            cursor.execute(f"TRUNCATE {target}")
        with cursor.cursor.copy(f"COPY {target} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types([kind for _, kind in columns])
            for row in rows:
                copy.write_row(row)
        if conflict:
            updates = ", ".join(f"{qn(n)} = excluded.{qn(n)}" for n in names if n not in conflict)
            cursor.execute(
                f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {target} "
                f"ON CONFLICT ({', '.join(qn(n) for n in conflict)}) DO UPDATE SET {updates}"
            )


def account(
    cluster_id: int,
    at: datetime,
    ref: DeviceRef,
    d: DeviceInfo | None,
    namespace: str,
    claim: str,
    active: float | None,
    previous: Mapping[str, Any] | None,
    limits: Thresholds,
) -> dict[str, Any]:
    """The holding's row after this round (pure): ``previous`` is its stored row (``_CARRIED``), None
    for a holding seen for the first time."""
    if previous is None:
        h: dict[str, Any] = {
            "first_seen": at,
            "last_seen": at,
            "samples": 0,
            "gap_samples": 0,
            "active_sum": 0.0,
            "observed_seconds": 0.0,
            "idle_seconds": 0.0,
            "idle_since": None,
            "node": "",
            "model": "",
            "profile": "",
            "gpu_fraction": 1.0,
        }
        elapsed = 0.0
    else:
        h = {name: previous[name] for name in _CARRIED}
        elapsed = min((at - h["last_seen"]).total_seconds(), 2 * limits.interval.total_seconds())
    h.update(
        cluster_id=cluster_id, namespace=namespace, claim=claim, driver=ref[0], pool=ref[1], device=ref[2]
    )
    if d is not None:
        h.update(node=d.node, model=d.model, profile=d.profile, gpu_fraction=d.gpu_fraction)
    h["last_seen"] = at
    if active is None:
        h["gap_samples"] += 1  # a gap: neither idle nor busy, and the idle stretch neither starts nor ends
        return h
    h["samples"] += 1
    h["active_sum"] += active
    h["observed_seconds"] += elapsed
    if active < limits.below:
        h["idle_seconds"] += elapsed
        h["idle_since"] = h["idle_since"] or at
    else:
        h["idle_since"] = None
    return h
