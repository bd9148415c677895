"""Pure builders for the fleet pages: per-cluster counts by state, stream health and the MIG slot view.

Counting is :mod:`fleet.counts`' (stored per GPU by the read model, read by :mod:`fleet.readmodel`); this
module lays the counts out per cluster, and MIG devices on their GPU's slots.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleet import counts, readmodel, selectors
from fleet.filters import FleetFilter
from fleet.models import stream_status
from fleet.normalize import FULL_GPU_SLICES
from fleet.selectors import (
    CounterSets,
    DeviceKey,
    FleetSummary,
    Holder,
    summarize,
    unavailable_devices,
)

_SLICE = re.compile(r"^memory-?[sS]lice-?(\d+)$")  # static: capacity memorySliceN; dynamic: memory-slice-N


def key_of(d: Mapping[str, Any]) -> DeviceKey:
    return (d["cluster_id"], d["driver"], d["pool"], d["name"])


def narrow(
    devices: Iterable[dict[str, Any]],
    filters: FleetFilter,
    labels: Mapping[tuple[int, str], Mapping[str, str]],
) -> list[dict[str, Any]]:
    """Devices on nodes matching the node-label filter (cluster, model and pool narrow the query)."""
    if not filters.label:
        return list(devices)
    return [d for d in devices if filters.matches_labels(labels.get((d["cluster_id"], d["node_name"]), {}))]


@dataclass
class ClusterOverview:
    """One cluster's devices by (model, kind, profile) and state, and its physical GPUs per model."""

    name: str
    summary: FleetSummary

    def groups(self, state: str = "") -> list[dict[str, Any]]:
        return group_rows(self.summary, state)


def group_rows(summary: FleetSummary, state: str = "") -> list[dict[str, Any]]:
    """The device table's rows (the ``state`` filter keeps the groups with a device in that state;
    "tainted" keeps those with a tainted device, "allocated" those allocated with no consumer)."""
    out = []
    for g in summary.groups:
        row = {
            "model": g.model,
            "kind": g.kind,
            "profile": g.profile,
            "total": g.total,
            "free": g.free,
            "reserved": g.reserved,
            "allocated": g.unreserved,
            "unavailable": g.unavailable,
            "tainted": g.tainted,
            "memory_bytes": g.memory_bytes,
        }
        if not state or row[state]:
            out.append(row)
    return out


def cluster_overviews(
    devices: list[dict[str, Any]],
    holders: Mapping[DeviceKey, list[Holder]],
    counter_sets: CounterSets,
    cluster_names: Mapping[int, str],
) -> list[ClusterOverview]:
    """Counts per cluster, partition-aware (see :mod:`fleet.counts`)."""
    by_cluster: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for d in devices:
        by_cluster[d["cluster_id"]].append(d)
    out = []
    for cid, name in sorted(cluster_names.items(), key=lambda item: item[1]):
        out.append(ClusterOverview(name, summarize(by_cluster.get(cid, []), holders, counter_sets)))
    return out


@dataclass(frozen=True)
class StreamHealth:
    cluster: str
    kind: str
    state: str
    status: str  # ok / stale / forbidden / error / backoff / starting
    resource_version: str
    objects: int
    last_event_at: datetime | None
    last_error: str

    @property
    def healthy(self) -> bool:
        return self.status == "ok"


def stream_health(cursors: Iterable[Any], now: datetime) -> list[StreamHealth]:
    """Each stream's status: stale when no worker vouches for it (its lease lapsed: a quiet cluster with a
    live worker is not stale, a dead worker's last "watching" is), else its own error state, else ok."""
    out = []
    for c in cursors:
        state = stream_status(c.state, c.lease_until, now)
        if state in ("stale", "forbidden", "error", "backoff"):
            status = state
        elif c.state in ("idle", "listing") and c.last_event_at is None:
            status = "starting"
        else:
            status = "ok"
        out.append(
            StreamHealth(
                c.cluster.name,
                c.kind,
                c.state,
                status,
                str(c.resource_version),
                c.object_count,
                c.last_event_at,
                c.last_error,
            )
        )
    return out


def device_state(key: DeviceKey, held: list[Holder], blocked: set[DeviceKey], tainted: bool) -> str:
    """:func:`fleet.counts.device_state` of a device held by ``held``."""
    reserved = any(h.state == "reserved" for h in held)
    return counts.device_state(bool(held), reserved, key in blocked, tainted)


def device_states(
    devices: list[dict[str, Any]], holders: Mapping[DeviceKey, list[Holder]], counter_sets: CounterSets
) -> list[dict[str, Any]]:
    """Device dicts with their ``state`` and ``holders``, whole GPUs first, in GPU order."""
    blocked = unavailable_devices(devices, set(holders), counter_sets)
    out = []
    for d in sorted(devices, key=lambda d: (d["gpu_minor"] or 0, d["kind"] != "gpu", -d["compute_slices"])):
        held = holders.get(key_of(d), [])
        state = device_state(key_of(d), held, blocked, d["tainted"])
        taints = counts.taint_text(d.get("taints") or ()) if d["tainted"] else []
        out.append({**d, "state": state, "holders": held, "taint_text": taints})
    return out


# ------------------------------------------------------------------------------------------- MIG slots


@dataclass
class MigBlock:
    """One MIG device placed on its GPU's compute slots."""

    name: str
    driver: str
    pool: str
    profile: str
    start: int
    size: int
    state: str  # free / allocated / reserved / unavailable / tainted
    claims: list[str] = field(default_factory=list)
    tainted: bool = False  # a NoSchedule/NoExecute taint, whatever the state


@dataclass
class MigGpu:
    cluster: str
    node: str
    index: int | None
    model: str
    dynamic: bool
    blocks: list[MigBlock] = field(default_factory=list)

    @property
    def free_slots(self) -> int:
        taken = ("allocated", "reserved", "tainted")
        used = {s for b in self.blocks if b.state in taken for s in range(b.start, b.start + b.size)}
        return FULL_GPU_SLICES - len(used)

    @property
    def shown(self) -> list[MigBlock]:
        """Static MIG: every device; dynamic MIG: only what is allocated (the rest are possibilities)."""
        return [b for b in self.blocks if not self.dynamic or b.state in ("allocated", "reserved")]


def placement(d: Mapping[str, Any]) -> int:
    """First compute slot of a MIG device: its lowest memory slice (static: capacity, dynamic: counters),
    kept inside the GPU's 7 slots."""
    slices = [int(m.group(1)) for k in d.get("capacity") or {} if (m := _SLICE.match(k))]
    for consumption in d["counters_consumed"]:
        slices += [int(m.group(1)) for k in consumption.get("counters") or {} if (m := _SLICE.match(k))]
    start = min(slices) if slices else 0
    return max(0, min(start, FULL_GPU_SLICES - max(d["compute_slices"], 1)))


def mig_gpus(
    devices: list[dict[str, Any]],
    holders: Mapping[DeviceKey, list[Holder]],
    counter_sets: CounterSets,
    cluster_names: Mapping[int, str],
    state: str = "",
) -> list[MigGpu]:
    """Every GPU carrying MIG devices, with each device placed and in its state, in node order."""
    allocated = set(holders)
    blocked = unavailable_devices(devices, allocated, counter_sets)
    gpus: dict[tuple[int, str], MigGpu] = {}
    whole: dict[tuple[int, str], dict[str, Any]] = {}
    for d in devices:
        if d["kind"] == "gpu" and d["gpu_uuid"]:
            whole[(d["cluster_id"], d["gpu_uuid"])] = d
        if d["kind"] != "mig" or not d["gpu_uuid"]:
            continue
        gpu = gpus.get((d["cluster_id"], d["gpu_uuid"]))
        if gpu is None:
            cluster = cluster_names.get(d["cluster_id"], str(d["cluster_id"]))
            node = d["node_name"] or d["pool"]
            gpu = MigGpu(cluster, node, d["gpu_minor"], d["model"], bool(d["counters_consumed"]))
            gpus[(d["cluster_id"], d["gpu_uuid"])] = gpu
        key = key_of(d)
        held = holders.get(key, [])
        block_state = device_state(key, held, blocked, d["tainted"])
        gpu.blocks.append(
            MigBlock(
                d["name"],
                d["driver"],
                d["pool"],
                d["mig_profile"],
                placement(d),
                max(d["compute_slices"], 1),
                block_state,
                [f"{h.namespace}/{h.name}" for h in held],
                bool(d["tainted"]),
            )
        )
    for gpu_key, d in whole.items():
        # Dynamic MIG publishes the whole GPU next to its partitions: allocated whole, it fills all 7 slots.
        held = holders.get(key_of(d), [])
        if gpu_key in gpus and held:
            whole_state = "reserved" if any(h.state == "reserved" for h in held) else "allocated"
            claims = [f"{h.namespace}/{h.name}" for h in held]
            gpus[gpu_key].blocks.append(
                MigBlock(
                    d["name"],
                    d["driver"],
                    d["pool"],
                    "whole GPU",
                    0,
                    FULL_GPU_SLICES,
                    whole_state,
                    claims,
                    bool(d["tainted"]),
                )
            )
    out = sorted(gpus.values(), key=lambda g: (g.cluster, g.model, g.node, g.index or 0))
    for g in out:
        g.blocks.sort(key=lambda b: (b.start, -b.size))
    if state:
        out = [g for g in out if any(b.state == state for b in g.blocks)]
    return out


@dataclass
class Fragmentation:
    """Per model: free MIG devices by profile and the GPUs they sit on."""

    model: str
    free_by_profile: dict[str, int]
    gpus_with_free: int
    free_slots: int
    largest_free: int  # compute slices of the biggest free device anywhere

    @property
    def fragmented(self) -> bool:
        """Free capacity exists, but spread so that no device of 3 or more slices is free."""
        return self.free_slots >= 3 and self.largest_free < 3


def fragmentation(gpus: Iterable[MigGpu]) -> list[Fragmentation]:
    acc: dict[str, Fragmentation] = {}
    for g in gpus:
        f = acc.get(g.model) or acc.setdefault(g.model, Fragmentation(g.model, {}, 0, 0, 0))
        free = [b for b in g.blocks if b.state == "free"]
        if free:
            f.gpus_with_free += 1
        f.free_slots += g.free_slots if free else 0
        # Static MIG: every free device; dynamic MIG: each profile still placeable counts once per GPU
        # (its overlapping partitions exclude each other).
        profiles = {b.profile: b.size for b in free} if g.dynamic else None
        for b in (
            free if profiles is None else [MigBlock("", "", "", p, 0, n, "free") for p, n in profiles.items()]
        ):
            f.free_by_profile[b.profile] = f.free_by_profile.get(b.profile, 0) + 1
            f.largest_free = max(f.largest_free, b.size)
    for f in acc.values():
        f.free_by_profile = dict(sorted(f.free_by_profile.items()))
    return sorted(acc.values(), key=lambda f: f.model)


# ------------------------------------------------------------------------------------- overview loading


def overviews_per_device(filters: FleetFilter, cluster_names: Mapping[int, str]) -> list[ClusterOverview]:
    """The overview's counts from every current device in Python: what the read model's rows are tested
    against (and the benchmarks' baseline)."""
    ids = list(cluster_names)
    devices, counter_sets = selectors.heatmap_devices(ids, model=filters.model, pool=filters.pool)
    labels = selectors.node_labels(ids) if filters.label else {}
    holders = selectors.allocation_holders(ids)
    return cluster_overviews(narrow(devices, filters, labels), holders, counter_sets, cluster_names)


def load_cluster_overviews(filters: FleetFilter, cluster_names: Mapping[int, str]) -> list[ClusterOverview]:
    """The overview's per-cluster counts for the filters (the state filter applies later, to the rows),
    from the per-GPU read model (:func:`fleet.readmodel.summaries`: kept per process until ingest changes
    the cluster's rows)."""
    nodes = None
    if filters.label:
        labels = selectors.node_labels(list(cluster_names))
        nodes = tuple(sorted(k for k, v in labels.items() if filters.matches_labels(v)))
    scope = selectors.OverviewScope(tuple(sorted(cluster_names)), filters.model, filters.pool, nodes)
    return compute_overviews(scope, filters, cluster_names)


def compute_overviews(
    scope: selectors.OverviewScope, filters: FleetFilter, cluster_names: Mapping[int, str]
) -> list[ClusterOverview]:
    """The overview's counts: the per-GPU read model's GPU and MIG rows of the scope, added up by two
    indexed aggregates (the same on every database), or this process's copy of them."""
    per_cluster = readmodel.summaries(
        readmodel.Scope(scope.cluster_ids, scope.model, scope.pool, scope.nodes, gpu_devices_only=True)
    )
    return [
        ClusterOverview(name, per_cluster.get(cid) or FleetSummary())
        for cid, name in sorted(cluster_names.items(), key=lambda item: item[1])
    ]
