"""Reads of the per-GPU read model (:class:`~fleet.models.GpuState`, :class:`~fleet.models.DeviceGroupState`):
the fleet's counts as plain ORM aggregates over pre-counted rows, the same on SQLite and PostgreSQL.

The rows are counted once, by :func:`fleet.counts.units`, when ingest writes the devices and allocations
they derive from; this module only adds them up: per (cluster, model, kind, MIG profile) for the device
groups, per (cluster, model) for the physical GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from fleet import counts
from fleet.counts import FleetSummary, GroupCount, ModelTotals
from fleet.models import DeviceGroupState, GpuState
from fleet.normalize import FULL_GPU_SLICES

_GROUP_SUMS = ("total", "allocated", "reserved", "unavailable", "tainted", "free", "memory_bytes")


@dataclass(frozen=True)
class Scope:
    """Which rows count: some clusters (``None``: all), optionally one model, one pool, some nodes
    ((cluster id, node name) pairs; ``None``: every node), and only GPU/MIG devices (the overview)."""

    cluster_ids: tuple[int, ...] | None = None
    model: str = ""
    pool: str = ""
    nodes: tuple[tuple[int, str], ...] | None = None
    gpu_devices_only: bool = False


def _scoped(rows: QuerySet[Any], scope: Scope) -> QuerySet[Any]:
    if scope.cluster_ids is not None:
        rows = rows.filter(cluster_id__in=scope.cluster_ids)
    if scope.model:
        rows = rows.filter(model=scope.model)
    if scope.pool:
        rows = rows.filter(pool=scope.pool)
    if scope.nodes is not None:
        by_cluster: dict[int, list[str]] = {}
        for cid, node in scope.nodes:
            by_cluster.setdefault(cid, []).append(node)
        on_nodes = Q(pk__in=[])
        for cid, nodes in by_cluster.items():
            on_nodes |= Q(cluster_id=cid, node_name__in=nodes)
        rows = rows.filter(on_nodes)
    return rows


def summaries(scope: Scope) -> dict[int, FleetSummary]:
    """Per cluster with rows in scope, its devices by (model, kind, profile) and state and its physical
    GPUs per model (:class:`fleet.counts.FleetSummary`, groups and models sorted). Two queries."""
    groups = _scoped(DeviceGroupState.objects.all(), scope)
    if scope.gpu_devices_only:
        groups = groups.filter(kind__in=("gpu", "mig"))
    out: dict[int, FleetSummary] = {}
    group_rows = (
        groups.values_list("cluster_id", "model", "kind", "profile")
        .annotate(**{f"sum_{name}": Sum(name) for name in _GROUP_SUMS})
        .order_by("cluster_id", "model", "kind", "profile")
    )
    for cid, model, kind, profile, *sums in group_rows:
        g = GroupCount(model, kind, profile, *sums)
        s = out.setdefault(cid, FleetSummary())
        s.groups.append(g)
        s.devices += g.total
        s.allocated += g.allocated
    gpu_rows = (
        _scoped(GpuState.objects.all(), scope)
        .values_list("cluster_id", "model")
        .annotate(
            n_gpus=Count("id"),
            n_mig=Count("id", filter=Q(mig=True)),
            n_dynamic=Count("id", filter=Q(dynamic=True)),
            n_whole=Count("id", filter=Q(whole_allocated=True)),
            n_tainted=Count("id", filter=Q(tainted=True)),
            n_used=Sum("compute_slices_allocated"),
        )
        .order_by("cluster_id", "model")
    )
    for cid, model, gpus, mig, dynamic, whole, tainted, used in gpu_rows:
        totals = ModelTotals(
            model, gpus, gpus - mig, mig, dynamic, whole, tainted, gpus * FULL_GPU_SLICES, used or 0
        )
        out.setdefault(cid, FleetSummary()).models.append(totals)
    return out


def fleet_summary(cluster_ids: Iterable[int] | None = None) -> FleetSummary:
    """The counts of some clusters (all with ``None``) added up (:func:`fleet.counts.merge`)."""
    ids = None if cluster_ids is None else tuple(cluster_ids)
    return counts.merge(summaries(Scope(cluster_ids=ids)).values())
