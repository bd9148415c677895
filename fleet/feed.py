"""The versioned fleet feed behind ``/ws/fleet/``: a snapshot, then deltas numbered version+1, version+2...

One :class:`FleetFeed` per websocket connection holds the rows its client has. Change events only mark
clusters dirty; :meth:`FleetFeed.delta` rebuilds the dirty clusters' rows from the database (the truth) and
sends what differs, so a lost or coalesced event can never leave a client wrong for longer than one batch.
A client that sees a version gap asks for a new snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleet import heatmap, selectors
from fleet.filters import FleetFilter
from fleet.models import Cluster

# Kinds whose changes can move a heatmap cell: slices (devices, taints), claims (allocations), nodes (labels).
RELEVANT_KINDS = frozenset({"ResourceSlice", "ResourceClaim", "Node"})
BATCH_SECONDS = 0.5  # at most one delta message per this interval


def load_rows(filters: FleetFilter, clusters: Iterable[str] | None = None) -> heatmap.Rows:
    """The heatmap rows for ``filters`` (limited to the named clusters when given); at most six queries."""
    names = set(clusters) if clusters is not None else None
    if filters.cluster:
        names = {filters.cluster} if names is None else names & {filters.cluster}
    query = Cluster.objects.all()
    if names is not None:
        query = query.filter(name__in=sorted(names))
    cluster_names = dict(query.values_list("id", "name"))
    ids = list(cluster_names)
    devices, counter_sets = selectors.heatmap_devices(
        ids, model=filters.model, pool=filters.pool, counters=False
    )
    holders = selectors.allocation_holders(ids)
    # Counters only matter where an allocated device consumes them (the blocked-partition rule).
    pools = {d["pool"] for d in devices if d["has_counters"] and heatmap.device_key(d) in holders}
    if pools:
        consumed = selectors.device_counters(ids, pools)
        for d in devices:
            if d["has_counters"]:
                d["counters_consumed"] = consumed.get(heatmap.device_key(d), [])
    labels = selectors.node_labels(ids) if filters.label else {}
    return heatmap.build_rows(devices, set(holders), counter_sets, holders, cluster_names, labels, filters)


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
            fresh = load_rows(self.filters, clusters=scope)
        except Exception:
            self.dirty |= scope  # retried with the next flush
            raise
        change = heatmap.diff(self.rows, fresh, scope=scope)
        if not change:
            return None
        self.rows = heatmap.apply(self.rows, change)
        self.version += 1
        return {"type": "delta", "version": self.version, "rows": change.rows, "removed": change.removed}


def apply_message(rows: heatmap.Rows, message: Mapping[str, Any]) -> heatmap.Rows:
    """What a client does with a delta message (the JavaScript mirrors this)."""
    return heatmap.apply(rows, heatmap.Delta(dict(message["rows"]), list(message["removed"])))
