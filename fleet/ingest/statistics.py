"""Planner statistics of the tables ingest fills: no write path leaves PostgreSQL's planner blind.

Until autovacuum analyzes new rows (a minute or more), the planner believes the tables nearly empty: the
heatmap's read of a few changed pools then took 26 s for 100 pools and 251 s for 10 on the L fleet (0.02 s
once analyzed), a cold heatmap on a freshly built database ran for minutes, and the live feed stalled for
the first minute of a new deployment. ANALYZE samples a fixed number of rows (about 0.1-0.5 s per large
table) and blocks no reader or writer, so ingest runs it itself after a write that grew a table by a large
part: an initial sync, an import, a restore replayed as batches, a build of a fleet in large batches.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection, models

# A batch writing at least this many objects, and more than this part of what the planner believes the
# table holds, is followed by ANALYZE: a growing table is analyzed at each doubling or so (a logarithmic
# number of times for a build from scratch), while the watch's small batches leave it to autovacuum.
GROWN_OBJECTS = 500
GROWN_FRACTION = 0.2


def analyze(tables: Iterable[type[models.Model]]) -> None:
    """ANALYZE the models' tables (PostgreSQL; a no-op elsewhere: SQLite plans without statistics)."""
    if connection.vendor != "postgresql":
        return
    qn = connection.ops.quote_name
    names = ", ".join(dict.fromkeys(qn(m._meta.db_table) for m in tables))
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {names}")


def planned_rows(model: type[models.Model]) -> float:
    """How many rows the planner believes ``model``'s table holds (0 when never analyzed)."""
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table])
        row = cur.fetchone()
    return max(float(row[0]), 0.0) if row else 0.0


def analyze_if_grown(model: type[models.Model], objects: int, tables: Iterable[type[models.Model]]) -> bool:
    """ANALYZE ``tables`` when a batch wrote ``objects`` rows of ``model``, a large part of its table (see
    :data:`GROWN_FRACTION`); True when it did. PostgreSQL only."""
    if connection.vendor != "postgresql" or objects < GROWN_OBJECTS:
        return False
    if objects <= GROWN_FRACTION * planned_rows(model):
        return False
    analyze(tables)
    return True
