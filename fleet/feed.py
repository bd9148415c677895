"""The versioned fleet feed behind ``/ws/fleet/``: a snapshot, then deltas numbered version+1, version+2...

One :class:`FleetFeed` per websocket connection holds the rows its client has. Change events only mark
clusters dirty; :meth:`FleetFeed.delta` reads the rows again (the truth) and sends what differs, so a lost
or coalesced event can never leave a client wrong for longer than one batch. A client that sees a version
gap asks for a new snapshot.

Reading the rows is shared by every connection of the process (:class:`GpuCache`): the physical GPUs of
every pool are kept in memory with a version of the pool (slice and allocation counts and their last write
time), and only pools whose version moved are read again, aggregated per GPU by PostgreSQL. Rows for a
filter are derived from those records and kept until the next change, so a thousand open pages cost one
rebuild per change, not a thousand.

Which pools to check: while a websocket consumer of the process listens to change events, each event
names the pools its batch touched (``"pools"``, see :func:`fleet.ingest.change_event`) and only those
pools' versions and GPUs are read, so a refresh costs what changed, not the fleet. A relist or an event
without pools has every pool of its cluster checked; the first listener (events before it were heard by
nobody) and the first refresh ``FULL_CHECK_SECONDS`` after the last full check make a full check (a
grouped query over every pool): a lost or dropped event converges then. With no listener (a process
serving pages only) every refresh is a full check, as nothing would tell it what changed.
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

# Kinds whose changes can move a heatmap cell: slices (devices, taints), claims (allocations), nodes (labels),
# DeviceTaintRules (taints).
RELEVANT_KINDS = frozenset({"ResourceSlice", "ResourceClaim", "Node", "DeviceTaintRule"})
# At most one delta message starts per this interval (fleet.consumers): a change after a quiet interval
# goes out at once, those within the interval after a delta coalesce into the next. A refresh reads only
# the changed pools (tens of milliseconds for a 500-event/s churn on the L fleet, bench/README.md).
BATCH_SECONDS = 0.25
# Events name the pools they changed; a full version check (a grouped query over every pool of a cluster,
# what each refresh cost before: ~0.5 s on the L fleet under load) this often catches what a lost event
# missed. It delays the delta it falls in, so it is rare: one delta in ~100 at a busy 0.25 s window.
FULL_CHECK_SECONDS = 30.0
POOL_KINDS = frozenset({"ResourceSlice", "ResourceClaim"})  # kinds whose events name changed pools
# A rule's event names no pool: its batch stamped the slices of the pools whose taints moved, which the
# cluster's version check finds.
WHOLE_CLUSTER_KINDS = frozenset({"DeviceTaintRule"})
CACHED_FILTERS = 32  # rows kept for this many distinct filters (least recently used go first)
PARTIAL_READ_LIMIT = 2000  # more changed pools than this: one read of the whole fleet is cheaper
LOGGED_GENERATIONS = 64  # rows older than this many changes are rebuilt whole, not node by node
Node = tuple[int, str]  # cluster id, node name (or pool, for GPUs published without a node)
Dirty = dict[str, set[tuple[str, str]] | None]  # cluster name -> (driver, pool) changed; None: all of them
_now = time.monotonic  # the clock of the full checks (tests move it)


def event_pools(event: Mapping[str, Any]) -> set[tuple[str, str]] | None:
    """The (driver, pool) pairs a ``fleet.change`` event says its batch touched; None when it does not say
    (a relist, an older publisher) or says it in a shape we do not know: then every pool may have moved."""
    pools = event.get("pools")
    if event.get("resync") or not isinstance(pools, list):
        return None
    out: set[tuple[str, str]] = set()
    for pair in pools:
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            log.warning("fleet.change with a malformed pool %r: checking the whole cluster", pair)
            return None
        out.add((pair[0], pair[1]))
    return out


class GpuCache:
    """The physical GPUs of the fleet as heatmap records, refreshed pool by pool; thread-safe.

    Precondition: one instance per database (the module's :data:`CACHE` checks the database name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Events are marked from the event loop's thread while a refresh may hold ``_lock`` for a while:
        # the dirty pools have their own lock, held only to add to them or to take them.
        self._dirty_lock = threading.Lock()
        self._dirty: Dirty = {}
        self._listeners = 0  # consumers of this process receiving change events
        self._unheard = True  # events may have gone by with nobody listening: the next refresh checks all
        self._reset("")
        self.reads = 0  # pools read from the database since the start (for tests and the benchmark)
        self.full_checks = 0  # full version checks since the start (for tests and the benchmark)

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
        self._checked_at: float | None = None  # when every pool's version was last checked

    def clear(self) -> None:
        """Forget everything (tests that recreate the database), listeners included."""
        with self._lock, self._dirty_lock:
            self._reset("")
            self._dirty, self._listeners, self._unheard = {}, 0, True

    def listen(self) -> None:
        """A consumer now receives change events (and passes them to :meth:`mark`) until :meth:`unlisten`.
        Call it after joining the group: with no listener before, events may have been missed."""
        with self._dirty_lock:
            if self._listeners == 0:
                self._unheard = True
            self._listeners += 1

    def unlisten(self) -> None:
        with self._dirty_lock:
            self._listeners = max(0, self._listeners - 1)

    def mark(self, event: Mapping[str, Any]) -> None:
        """Note the pools a ``fleet.change`` event changed, for the next refresh. Every connection gets
        every event: marking the same pools again is a no-op."""
        if event.get("kind") not in POOL_KINDS | WHOLE_CLUSTER_KINDS:
            return
        cluster = str(event.get("cluster", ""))
        pools = None if event.get("kind") in WHOLE_CLUSTER_KINDS else event_pools(event)
        with self._dirty_lock:
            if pools is None:
                self._dirty[cluster] = None
                return
            have = self._dirty.setdefault(cluster, set())
            if have is not None:
                have |= pools

    def _take_dirty(self) -> tuple[Dirty, bool]:
        """The dirty pools so far (now forgotten), and whether they are all that changed since the last
        refresh (a listener heard every event meanwhile)."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, {}
            heard = self._listeners > 0 and not self._unheard
            self._unheard = False
            return dirty, heard

    def _restore_dirty(self, dirty: Dirty, heard: bool) -> None:
        """Give back what :meth:`_take_dirty` took, after a refresh that failed."""
        with self._dirty_lock:
            for cluster, pools in dirty.items():
                have = self._dirty.get(cluster, set())
                self._dirty[cluster] = None if pools is None or have is None else have | pools
            self._unheard = self._unheard or not heard

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
        dirty, heard = self._take_dirty()
        try:
            self._refresh_pools(dirty, heard)
        except Exception:
            self._restore_dirty(dirty, heard)  # retried by the next refresh
            raise
        if with_labels:
            nodes = selectors.node_versions(self._names)
            if nodes != self._node_versions:
                self._labels = selectors.node_labels(list(self._names))
                self._node_versions = nodes
                self._bump(None)

    def _refresh_pools(self, dirty: Dirty, heard: bool) -> None:
        database = str(connection.settings_dict.get("NAME"))
        if database != self._database:
            self._reset(database)
        names = dict(Cluster.objects.values_list("id", "name"))
        renamed = names != self._names
        if renamed:
            self._names = names
            self._bump(None)
        now = _now()
        full = (
            renamed or not heard or self._checked_at is None or now - self._checked_at >= FULL_CHECK_SECONDS
        )
        if full:
            versions = self._checked_versions(names)
            self._checked_at = now
            self.full_checks += 1
        else:
            # Only the dirty pools: compared and updated in place, never a pass over every pool.
            fresh, candidates = self._dirty_versions(names, dirty)
            changed = {k for k, v in fresh.items() if self._versions.get(k) != v}
            gone = {k for k in candidates if k not in fresh and k in self._versions}
            if changed or gone:
                self._bump(
                    self._read(list(names), changed, gone, everything=len(changed) > PARTIAL_READ_LIMIT)
                )
            for key in gone:
                del self._versions[key]
            self._versions.update(fresh)
            return
        changed = {k for k, v in versions.items() if self._versions.get(k) != v}
        gone = {k for k in self._pools if k not in versions}
        if changed or gone:
            touched = self._read(list(names), changed, gone, everything=len(changed) > PARTIAL_READ_LIMIT)
            self._bump(touched)
        self._versions = versions

    def _checked_versions(self, names: Mapping[int, str]) -> dict[PoolKey, tuple[Any, ...]]:
        """Every pool's version: one cheap query per cluster, the per-pool versions of the clusters that
        changed since the last full check (a grouped query over all of their pools)."""
        clusters = selectors.cluster_versions(names)
        stale = [cid for cid in names if clusters.get(cid) != self._cluster_versions.get(cid)]
        self._cluster_versions = clusters
        versions = {k: v for k, v in self._versions.items() if k[0] in names and k[0] not in stale}
        if stale:
            versions |= selectors.pool_versions(stale)
        return versions

    def _dirty_versions(
        self, names: Mapping[int, str], dirty: Dirty
    ) -> tuple[dict[PoolKey, tuple[Any, ...]], set[PoolKey]]:
        """The current versions of the ``dirty`` pools (of every pool of a cluster marked whole), and the
        pools asked for: one of them missing from the versions has no slice left."""
        ids = {name: cid for cid, name in names.items()}
        whole = {ids[n] for n, pools in dirty.items() if pools is None and n in ids}
        keys = {
            (ids[n], driver, pool)
            for n, pools in dirty.items()
            if pools and n in ids and ids[n] not in whole
            for driver, pool in pools
        }
        fresh: dict[PoolKey, tuple[Any, ...]] = {}
        candidates = set(keys)
        if whole:
            fresh |= selectors.pool_versions(sorted(whole))
            candidates |= {k for k in self._versions if k[0] in whole}
        if keys:
            fresh |= selectors.pool_versions(sorted({k[0] for k in keys}), keys)
        return fresh, candidates

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
        gpus = heatmap.gpus_of_states(selectors.gpu_states(cluster_ids, None if everything else pools))
        for gpu in gpus:
            key = (gpu.cluster_id, gpu.driver, gpu.pool)
            if key in pools:
                self._pools.setdefault(key, []).append(gpu)
                self._node_pools[(gpu.cluster_id, gpu.node)].add(key)
                touched.add((gpu.cluster_id, gpu.node))
        return touched


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
        """Note a ``fleet.change`` event; True when it may change what this client sees. The shared cache
        notes the pools it names whatever this client's filters (other clients' rows come from it too)."""
        CACHE.mark(event)
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
