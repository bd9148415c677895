"""Applying a batch of watch events, or a whole list (relist), in one transaction."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from decimal import Decimal
from itertools import islice

from django.db import models, transaction
from django.utils import timezone

from fleet.ingest import cursors, events, gpu_state, locks, rows, statistics
from fleet.ingest import pools as pool_discovery
from fleet.ingest.specs import SPECS, BatchResult, Change, CursorUpdate, TableSpec
from fleet.ingest.sql import COPY_ROWS
from fleet.models import Cluster, WatchCursor
from fleet.normalize import Record

log = logging.getLogger(__name__)


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
    gpu_state.took_owed()  # a payment an earlier call rolled back is not this one's
    with transaction.atomic():
        locks.stream_lock(cluster, kind, exclusive=False)
        result = BatchResult(kind)
        touched = [*upserts, *deletes]
        # The rows about to be replaced or deleted: their pools, and for claims the devices they hold
        pools, devices = pool_discovery.pools_and_devices(cluster, spec, touched)
        result.written = rows.upsert(cluster, spec, upserts, observed_at)
        result.stale = len(upserts) - len(result.written)
        result.deleted = rows.delete(cluster, spec, deletes, observed_at)
        # Before anything reads what the batch wrote: the joins below must not be planned as if the tables
        # were empty (finding the pools of an import's 9,200 slices took 107 s so, 0.2 s analyzed).
        grown = statistics.analyze_if_grown(
            spec.model, len(result.written) + len(result.deleted), tables_of(spec)
        )
        # ... and those written in their place (nothing written or deleted: no event, no pools needed)
        if result.changed:
            written_pools, written_devices = pool_discovery.pools_and_devices(cluster, spec, touched)
            pools |= written_pools
            devices |= written_devices
        result.pools = pools
        refreshed = False
        if result.changed and pool_discovery.pooled(spec):
            # The per-GPU read model of the pools whose devices changed; for claims, of the devices whose
            # holders changed (who holds a device moves only its GPU's rows, not its pool's).
            names = {p for _, p in result.pools}
            held = devices if pool_discovery.names_devices(spec) else None
            refreshed = gpu_state.update(cluster.pk, names, held)
        if cursor:
            cursors.save_cursor(cluster, kind, cursor, forward_only=True)
        events.publish_on_commit(cluster, result)
    # A whole cluster's rows written at once, like a first list's: whatever wrote them (a rule's hook too)
    paid = gpu_state.took_owed()
    if paid or (refreshed and grown):
        statistics.analyze(gpu_state.READ_MODEL)  # after commit: two batches never wait on each other here
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

    ``records`` may be lazy (a generator normalizing a paged list): they are consumed and written a page
    of ``RELIST_PAGE`` at a time (with their children and the kind's history hook), so a relist holds one
    page of records, plus the keys and versions of the kind, never the whole list. All pages go in one
    transaction: the relist is applied whole or not at all."""
    spec = SPECS[kind]
    observed_at = observed_at or timezone.now()
    gpu_state.took_owed()
    with transaction.atomic():
        fresh = locks.lock_if_fresh(
            cluster, kind, spec
        )  # the stream's lock: exclusive when fresh, else shared
        result = BatchResult(kind)
        pooled = pool_discovery.pooled(spec)
        everything = fresh  # the read model's rows to recompute: the cluster's, or those of ``touched``
        touched: set[tuple[str, str]] = set()
        stored = WatchCursor.objects.filter(cluster=cluster, kind=kind).values_list(
            "resource_version", flat=True
        )
        # A list that replaces a position the stream had is a relist (the first list is not).
        relisted = bool(stored) and int(stored[0]) > 0
        replaced: list[tuple[str, ...]] = []  # deleted before the list is written (see below)
        if stored and int(stored[0]) > list_resource_version:
            # The server went back in time (etcd restored, cluster rebuilt under the same name): our
            # rows may carry versions the server will never reach again, so the fence cannot apply.
            # Rare enough to hold the list once.
            log.warning("%s/%s: list at %d is older than our cursor %d; replacing all", cluster.name, kind,
                        list_resource_version, int(stored[0]))  # fmt: skip
            records = list(records)
            all_keys = [
                tuple(k)
                for k in spec.model._default_manager.filter(cluster=cluster).values_list(*spec.natural_key)
            ]
            everything = True
            # Objects the list still has are rewritten below: for the history they never went away.
            listed_uids = {r.meta.uid for r in records}
            replaced = rows.delete_keys(cluster, spec, all_keys, observed_at, keep_history_of=listed_uids)
        # Most of a relist is what is stored already, at the same resourceVersion (the same object): left
        # out before the upsert, so they cost one read of the versions instead of a staged row each. The
        # fence would skip them too (a concurrent writer is still ordered by it).
        stored_at = {} if fresh else stored_versions(cluster, spec)
        present: set[tuple[str, ...]] = set()
        count = 0
        for page in pages(records, RELIST_PAGE):
            count += len(page)
            if fresh:  # nothing stored, so nothing newer: every record is written, by COPY
                result.written += rows.upsert(cluster, spec, page, observed_at, fresh=True)
            else:
                present.update(spec.key_of(r) for r in page)
                newer = [r for r in page if stored_at.get(spec.key_of(r)) != r.meta.resource_version]
                if pooled and not everything:  # the pools of the rows about to be replaced
                    touched |= pool_discovery.child_pools(cluster, spec, newer)
                written = rows.upsert(cluster, spec, newer, observed_at)
                if pooled and not everything and written:  # ... and of those written in their place
                    touched |= pool_discovery.child_pools(cluster, spec, newer)
                result.written += written
                del newer
            del page  # else it would live on while the next page is read and normalized
        result.stale = count - len(result.written)
        result.resync = True
        if not fresh:  # else nothing was stored, so nothing can be absent from the list
            absent = [
                key
                for key in spec.model._default_manager.filter(
                    cluster=cluster, resource_version__lte=list_resource_version
                ).values_list(*spec.natural_key)
                if tuple(key) not in present
            ]
            if pooled and not everything:
                touched |= pool_discovery.stored_pools(cluster, spec, [tuple(k) for k in absent])
            # Deleted only if still not newer than the list when the DELETE runs (a watch batch may have
            # committed a newer version since the read above).
            result.deleted = rows.delete_keys(
                cluster, spec, [tuple(k) for k in absent], observed_at, max_version=list_resource_version
            )
            # What a relist replacing everything deleted and did not write again is deleted too: else a
            # list now empty would change the kind and publish nothing.
            result.deleted += [k for k in replaced if tuple(k) not in present]
        # Before the read model reads what the relist wrote (see apply_batch); an initial sync always.
        if fresh:
            statistics.analyze(tables_of(spec))
        grown = fresh or statistics.analyze_if_grown(
            spec.model, len(result.written) + len(result.deleted), tables_of(spec)
        )
        refreshed = False
        if result.changed and pooled and fresh:
            others = [k for k, s in SPECS.items() if k != kind and pool_discovery.pooled(s)]
            refreshed = gpu_state.after_first_list(cluster.pk, lambda: cursors.listing(cluster, others))
        elif result.changed and pooled:
            refreshed = gpu_state.update(cluster.pk, None if everything else {p for _, p in touched})
        elif pooled:  # a list that changed nothing may be the one another's first list counted on
            refreshed = gpu_state.pay_owed(cluster.pk)
        if cursor:
            cursors.save_cursor(
                cluster,
                kind,
                CursorUpdate(list_resource_version, "watching", objects=count),
                relisted=relisted,
            )
        events.publish_on_commit(cluster, result)
    paid = gpu_state.took_owed()
    if paid or (refreshed and grown):
        statistics.analyze(gpu_state.READ_MODEL)
    return result


# Records a relist writes at a time: enough for COPY (a page below COPY_ROWS goes through INSERT statements
# whose thousands of placeholders psycopg parses in Python: 500-record pages made a 40,000-claim sync 1.7x
# slower than one page), small enough that a page of the L fleet's slices is a fifth of the list.
RELIST_PAGE = COPY_ROWS


def pages(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    """``records`` in lists of ``size`` (the last one shorter), consumed as they are asked for."""
    it = iter(records)
    while True:
        page = list(islice(it, size))
        if not page:
            return
        yield page
        del page  # not kept while the next one is read


def tables_of(spec: TableSpec) -> list[type[models.Model]]:
    """The mirrored tables a batch of the kind writes: its own and its children's."""
    return [spec.model, *(c.model for c in spec.children)]


def stored_versions(cluster: Cluster, spec: TableSpec) -> dict[tuple[str, ...], Decimal]:
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
