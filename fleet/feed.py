"""The versioned fleet feed behind ``/ws/fleet/``: a snapshot, then deltas numbered version+1, version+2...

One :class:`FleetFeed` per websocket connection holds the rows its client has. Change events only mark
clusters dirty; :meth:`FleetFeed.delta` reads the rows again (the truth) and sends what differs, so a lost
or coalesced event can never leave a client wrong for longer than one batch. A client that sees a version
gap asks for a new snapshot.

Reading the rows is shared by every connection of the process (:class:`GpuCache`): the physical GPUs of
every pool are kept in memory with a version of the pool (slice and allocation counts and their last write
time, two grouped queries), and only pools whose version moved are read again, aggregated per GPU by
PostgreSQL. Rows for a filter are derived from those records and kept until the next change, so a
thousand open pages cost one rebuild per change, not a thousand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connection

from fleet import heatmap, selectors
from fleet.filters import FleetFilter
from fleet.models import Cluster
from fleet.selectors import PoolKey

log = logging.getLogger(__name__)

# Kinds whose changes can move a heatmap cell: slices (devices, taints), claims (allocations), nodes (labels).
RELEVANT_KINDS = frozenset({"ResourceSlice", "ResourceClaim", "Node"})
BATCH_SECONDS = 0.5  # at most one delta message per this interval
CACHED_FILTERS = 32  # rows kept for this many distinct filters (least recently used go first)
PARTIAL_READ_LIMIT = 2000  # more changed pools than this: one read of the whole fleet is cheaper
LOGGED_GENERATIONS = 64  # rows older than this many changes are rebuilt whole, not node by node
Node = tuple[int, str]  # cluster id, node name (or pool, for GPUs published without a node)


class GpuCache:
    """The physical GPUs of the fleet as heatmap records, refreshed pool by pool; thread-safe.

    Precondition: one instance per database (the module's :data:`CACHE` checks the database name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset("")
        self.reads = 0  # pools read from the database since the start (for tests and the benchmark)

    def _reset(self, database: str) -> None:
        self._database = database
        self._versions: dict[PoolKey, tuple[Any, ...]] = {}
        self._cluster_versions: dict[int, tuple[int, ...]] = {}
        self._pools: dict[PoolKey, list[heatmap.Gpu]] = {}
        self._node_pools: dict[Node, set[PoolKey]] = defaultdict(set)  # pools with GPUs on each node
        self._node_versions: dict[int, tuple[Any, ...]] = {}
        self._labels: dict[Node, dict[str, str]] = {}
        self._names: dict[int, str] = {}
        self._generation = 0  # moves whenever a record, a cluster or (with labels read) a node changed
        # What each generation changed: the nodes whose rows to rebuild, or None for "everything".
        self._log: list[tuple[int, set[Node] | None]] = []
        self._rows: OrderedDict[FleetFilter, tuple[int, heatmap.Rows]] = OrderedDict()

    def clear(self) -> None:
        """Forget everything (tests that recreate the database)."""
        with self._lock:
            self._reset("")

    def rows(self, filters: FleetFilter) -> heatmap.Rows:
        """The heatmap rows for ``filters`` as of now. The returned dict is shared: do not modify it."""
        with self._lock:
            self._refresh(with_labels=bool(filters.label))
            cached = self._rows.get(filters)
            if cached is not None and cached[0] == self._generation:
                self._rows.move_to_end(filters)
                return cached[1]
            names = self._names
            if filters.cluster:
                names = {cid: n for cid, n in names.items() if n == filters.cluster}
            nodes = self._changed_since(cached[0]) if cached is not None else None
            if cached is None or nodes is None:
                gpus = (g for records in self._pools.values() for g in records)
                rows = heatmap.rows_of(gpus, names, self._labels, filters)
            else:
                # Rebuild only the rows of nodes that changed since these rows were made.
                rows = dict(cached[1])
                for cid, node in nodes:
                    if cid in names:
                        rows.pop(heatmap.row_key(names[cid], node), None)
                gpus = (
                    g
                    for n in nodes
                    for pool in self._node_pools.get(n, ())
                    for g in self._pools.get(pool, ())
                    if (g.cluster_id, g.node) == n
                )
                rows.update(heatmap.rows_of(gpus, names, self._labels, filters))
            self._rows[filters] = (self._generation, rows)
            self._rows.move_to_end(filters)
            while len(self._rows) > CACHED_FILTERS:
                self._rows.popitem(last=False)
            return rows

    def _changed_since(self, generation: int) -> set[Node] | None:
        """The nodes changed after ``generation``, or None when unknown or everything changed."""
        if not self._log or self._log[0][0] > generation + 1:
            return None
        out: set[Node] = set()
        for gen, nodes in self._log:
            if gen > generation:
                if nodes is None:
                    return None
                out |= nodes
        return out

    def _bump(self, nodes: set[Node] | None) -> None:
        self._generation += 1
        self._log = [*self._log[-(LOGGED_GENERATIONS - 1) :], (self._generation, nodes)]

    def _refresh(self, with_labels: bool) -> None:
        database = str(connection.settings_dict.get("NAME"))
        if database != self._database:
            self._reset(database)
        names = dict(Cluster.objects.values_list("id", "name"))
        if names != self._names:
            self._names = names
            self._bump(None)
        if connection.vendor == "postgresql":
            # One cheap query per refresh; the per-pool versions only for clusters that changed.
            clusters = selectors.cluster_versions(names)
            stale = [cid for cid in names if clusters.get(cid) != self._cluster_versions.get(cid)]
            self._cluster_versions = clusters
            versions = {k: v for k, v in self._versions.items() if k[0] in names and k[0] not in stale}
            if stale:
                versions |= selectors.pool_versions(stale)
        else:  # the demo's SQLite: small fleets, read whole every time
            versions = {k: (self._generation,) for k in self._all_pools(names)}
        changed = {k for k, v in versions.items() if self._versions.get(k) != v}
        gone = {k for k in self._pools if k not in versions}
        if changed or gone:
            touched = self._read(list(names), changed, gone, everything=len(changed) > PARTIAL_READ_LIMIT)
            self._bump(touched)
        self._versions = versions
        if with_labels:
            nodes = selectors.node_versions(names)
            if nodes != self._node_versions:
                self._labels = selectors.node_labels(list(names))
                self._node_versions = nodes
                self._bump(None)

    @staticmethod
    def _all_pools(names: Mapping[int, str]) -> set[PoolKey]:
        from fleet.models import ResourceSlice

        rows = ResourceSlice.objects.filter(cluster_id__in=list(names)).values_list(
            "cluster_id", "driver", "pool"
        )
        return set(rows)

    def _read(
        self, cluster_ids: list[int], pools: set[PoolKey], gone: set[PoolKey], everything: bool
    ) -> set[Node]:
        """Read the GPUs of ``pools`` (of every pool with ``everything``) into the cache and drop those of
        ``gone``; returns the nodes whose GPUs may have changed."""
        self.reads += len(pools)
        touched: set[Node] = set()
        for key in pools | gone:
            for g in self._pools.pop(key, ()):
                touched.add((g.cluster_id, g.node))
                self._node_pools[(g.cluster_id, g.node)].discard(key)
        if pools and connection.vendor == "postgresql":
            rows = selectors.heatmap_gpu_rows(cluster_ids, None if everything else pools)
            held = {(r[0], r[1], r[2]) for r in rows if r[12]}  # an allocated device consumes counters
            gpus = heatmap.gpus_of_sql_rows(rows, _blocked_gpus(cluster_ids, held) if held else set())
        elif pools:
            gpus = _gpus_in_python(cluster_ids, pools)
        else:
            gpus = []
        for gpu in gpus:
            key = (gpu.cluster_id, gpu.driver, gpu.pool)
            if key in pools:
                self._pools.setdefault(key, []).append(gpu)
                self._node_pools[(gpu.cluster_id, gpu.node)].add(key)
                touched.add((gpu.cluster_id, gpu.node))
        return touched


def _blocked_gpus(cluster_ids: list[int], pools: set[PoolKey]) -> set[tuple[int, str]]:
    """GPUs of ``pools`` with a partition blocked by the counters its allocated siblings use."""
    return selectors.counter_blocked_gpus(cluster_ids, pools)


def _gpus_in_python(cluster_ids: list[int], pools: set[PoolKey]) -> list[heatmap.Gpu]:
    """:func:`heatmap.gpu_records` over device dicts: the path on databases other than PostgreSQL."""
    devices, counter_sets = selectors.heatmap_devices(cluster_ids)
    devices = [d for d in devices if (d["cluster_id"], d["driver"], d["pool"]) in pools]
    holders = selectors.allocation_holders(cluster_ids)
    return heatmap.gpu_records(devices, set(holders), counter_sets, holders)


CACHE = GpuCache()


def load_rows(filters: FleetFilter, clusters: Iterable[str] | None = None) -> heatmap.Rows:
    """The heatmap rows for ``filters`` (limited to the named clusters when given). The dict is shared
    with other callers: treat it as read-only."""
    rows = CACHE.rows(filters)
    if clusters is None:
        return rows
    names = set(clusters)
    return {k: r for k, r in rows.items() if r[0] in names}


def warm() -> None:
    """Fill the GPU cache with the whole fleet (the unfiltered view) in this process; any failure is
    logged, never raised: the first request then builds the cache itself."""
    started = time.monotonic()
    try:
        rows = load_rows(FleetFilter())
        log.info("heatmap cache warm: %d rows in %.1f s", len(rows), time.monotonic() - started)
    except Exception:
        log.exception("heatmap cache warm-up failed")
    finally:
        connection.close()  # this thread's connection, so it never lingers


def rows_from_devices(filters: FleetFilter) -> heatmap.Rows:
    """The heatmap rows built from scratch from device dicts (no cache, no aggregation in SQL): the
    reference :func:`load_rows` is tested against, and a check for operators."""
    names = dict(Cluster.objects.values_list("id", "name"))
    if filters.cluster:
        names = {cid: n for cid, n in names.items() if n == filters.cluster}
    devices, counter_sets = selectors.heatmap_devices(list(names), model=filters.model, pool=filters.pool)
    holders = selectors.allocation_holders(list(names))
    labels = selectors.node_labels(list(names)) if filters.label else {}
    return heatmap.build_rows(devices, set(holders), counter_sets, holders, names, labels, filters)


class FleetFeed:
    """What one client has seen: its filters, its rows and the version of the last message sent."""

    def __init__(self, filters: FleetFilter) -> None:
        self.filters = filters
        self.version = 0
        self.rows: heatmap.Rows = {}
        self.dirty: set[str] = set()

    def snapshot(self) -> dict[str, Any]:
        """A full snapshot message (resets the dirty set: it reflects everything committed so far)."""
        self.dirty.clear()
        self.rows = load_rows(self.filters)
        self.version += 1
        return {
            "type": "snapshot",
            "version": self.version,
            "filters": self.filters.as_dict(),
            "rows": self.rows,
        }

    def mark(self, event: Mapping[str, Any]) -> bool:
        """Note a ``fleet.change`` event; True when it may change what this client sees."""
        cluster = str(event.get("cluster", ""))
        if event.get("kind") not in RELEVANT_KINDS:
            return False
        if self.filters.cluster and cluster != self.filters.cluster:
            return False
        self.dirty.add(cluster)
        return True

    def delta(self) -> dict[str, Any] | None:
        """The delta message for the dirty clusters, or None when nothing this client sees changed."""
        if not self.dirty:
            return None
        # Swap first: events arriving while the rows load mark the new set, for the next delta.
        scope, self.dirty = self.dirty, set()
        try:
            fresh = load_rows(self.filters)
        except Exception:
            self.dirty |= scope  # retried with the next flush
            raise
        # Every cluster, not only the dirty ones: the shared rows may already hold a change whose event
        # has not reached this connection yet; then that event's flush finds nothing left to send.
        change = heatmap.diff(self.rows, fresh)
        if not change:
            return None
        self.rows = heatmap.apply(self.rows, change)
        self.version += 1
        return {"type": "delta", "version": self.version, "rows": change.rows, "removed": change.removed}


def apply_message(rows: heatmap.Rows, message: Mapping[str, Any]) -> heatmap.Rows:
    """What a client does with a delta message (the JavaScript mirrors this)."""
    return heatmap.apply(rows, heatmap.Delta(dict(message["rows"]), list(message["removed"])))
