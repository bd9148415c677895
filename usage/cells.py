"""Utilization per physical GPU, shaped for the heatmap: ``{"<cluster>/<node>": {"<gpu index>": cell}}``.

A cell is ``[activity percent or null, idle]``: the activity of the GPU's measured devices weighted by their
share of the GPU (a MIG device counts its compute slices / 7), null when none of its devices had a value
this round (a gap, drawn as a gap, never as 0 %); ``idle`` is 1 when a device on it is allocated and has been
below the idle threshold for the idle window. Rows and indexes are the heatmap's (``fleet.heatmap``).

Computed at the end of each sampling round and kept in the cache, so the heatmap's utilization mode costs a
cache read, like its allocation mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache

from fleet.heatmap import row_key
from fleet.models import Cluster
from usage.join import DeviceInfo, DeviceRef

Cells = dict[str, dict[str, list[Any]]]
CACHE_KEY = "usage:gpu-cells:{}"


def gpu_cells(
    cluster: str,
    devices: Iterable[DeviceInfo],
    active: Mapping[DeviceRef, float | None],
    idle_since: Mapping[DeviceRef, datetime | None],
    at: datetime,
    window: timedelta,
) -> Cells:
    """The heatmap cells of one cluster (pure). ``active`` holds this round's value of every device it
    measured (None: no activity metric); ``idle_since`` the idle stretch of the held ones."""
    sums: dict[tuple[str, str], list[Any]] = {}
    rows: dict[str, str] = {}  # node or pool -> heatmap row: one string built per node, not per device
    indexes: dict[int, str] = {}  # GPU index -> its string, built once
    for d in devices:
        minor = d.minor
        if minor is None:
            continue
        where = d.node or d.ref[1]
        row = rows.get(where)
        if row is None:
            row = rows[where] = row_key(cluster, where)
        index = indexes.get(minor)
        if index is None:
            index = indexes[minor] = str(minor)
        key = (row, index)
        cell = sums.get(key)
        if cell is None:
            cell = sums[key] = [0.0, False, 0]
        value = active.get(d.ref)
        if value is not None:
            cell[0] += value * d.gpu_fraction
            cell[1] = True
        since = idle_since.get(d.ref)
        if since is not None and at - since >= window:
            cell[2] = 1
    out: Cells = {}
    for (row, index), (total, measured, idle) in sums.items():
        out.setdefault(row, {})[index] = [round(min(total, 1.0) * 100, 1) if measured else None, idle]
    return out


def store(cluster: Cluster, cells: Cells, at: datetime) -> None:
    cache.set(CACHE_KEY.format(cluster.pk), {"at": at.isoformat(), "rows": cells}, timeout=None)


def load(cluster_ids: Iterable[int]) -> tuple[Cells, dict[int, str]]:
    """The cached cells of the clusters, and each cluster's round time (clusters never sampled: absent)."""
    rows: Cells = {}
    times: dict[int, str] = {}
    keys = {CACHE_KEY.format(cid): cid for cid in cluster_ids}
    for key, value in cache.get_many(list(keys)).items():
        rows.update(value["rows"])
        times[keys[key]] = value["at"]
    return rows, times


def from_database(cluster_id: int) -> Cells:
    """The cells of a cluster's last stored round (when the cache lost them)."""
    from django.conf import settings

    from usage.models import DeviceUsage
    from usage.sampler import device_infos

    rows = list(DeviceUsage.objects.filter(cluster_id=cluster_id))
    if not rows:
        return {}
    name = Cluster.objects.get(pk=cluster_id).name
    at = max(r.sampled_at for r in rows)
    return gpu_cells(
        name,
        device_infos(cluster_id),
        {(r.driver, r.pool, r.device): r.active for r in rows if r.matched_by},
        {(r.driver, r.pool, r.device): r.idle_since for r in rows if r.idle_since},
        at,
        timedelta(minutes=settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES),
    )
