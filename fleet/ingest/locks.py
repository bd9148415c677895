"""Stream locks (one advisory lock per cluster and kind) and the watch cursors saved with each batch."""

from __future__ import annotations

import zlib

from django.db import connection

from fleet.ingest.specs import TableSpec
from fleet.models import Cluster


def _stream_key(cluster: Cluster, kind: str) -> tuple[int, int]:
    """The advisory-lock key of a (cluster, kind): two int4, the cluster id and a stable hash of the kind."""
    return cluster.pk, zlib.crc32(kind.encode()) - 2**31


def stream_lock(cluster: Cluster, kind: str, exclusive: bool) -> None:
    """Take the (cluster, kind) advisory lock for this transaction: shared for every ordinary batch, so
    writers of a stream never wait for each other (the fence orders them); exclusive for the initial-sync
    COPY, which must be the only writer of that cluster's rows of that kind. Other clusters and kinds never
    wait. PostgreSQL only; a no-op elsewhere (the demo's SQLite serializes writers anyway)."""
    if connection.vendor != "postgresql" or not connection.in_atomic_block:
        return
    fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    with connection.cursor() as cur:
        cur.execute(f"SELECT {fn}(%s, %s)", list(_stream_key(cluster, kind)))


def read_model_lock(cluster_id: int) -> None:
    """Take the cluster's per-GPU read-model lock for this transaction (exclusive), before reading what the
    rows derive from. Batches of different kinds run concurrently (a slice batch and a claim batch of one
    pool): without it each would recompute the pool from a snapshot missing the other's uncommitted rows,
    and the last to commit would store rows missing the other's change. With it the second waits for the
    first's commit, then reads its rows (READ COMMITTED: each statement sees what committed before it).
    Taken last in a batch, just before commit, so it is held briefly and never waited on while holding it.
    PostgreSQL only; a no-op elsewhere (SQLite serializes writers)."""
    if connection.vendor != "postgresql" or not connection.in_atomic_block:
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", [cluster_id, zlib.crc32(b"read model") - 2**31])


def lock_if_fresh(cluster: Cluster, kind: str, spec: TableSpec) -> bool:
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
            stream_lock(cluster, kind, exclusive=False)
            return False
        stream_lock(cluster, kind, exclusive=True)
        cur.execute(f"SELECT {probe}", [cluster.pk] * len(tables))  # what committed before the lock
        return not cur.fetchone()[0]


# ------------------------------------------------------------------------------------------- events
