"""Read queries behind the fleet endpoints of the REST API.

They reuse the rules of :mod:`fleet.selectors`: only devices of a pool's highest generation are current,
allocated means named in a non-adminAccess allocation result, and a physical GPU's allocated share is its
allocated compute slices out of 7.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from django.db.models import (
    BooleanField,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Window,
)

from fleet import counts, readmodel
from fleet.models import Cluster, Device, DeviceAllocation, GpuState, ResourceClaim, ResourceSlice
from fleet.normalize import FULL_GPU_SLICES

log = logging.getLogger(__name__)


def _allocations() -> QuerySet[Any]:
    return DeviceAllocation.objects.filter(admin_access=False)


def newest_generation() -> Subquery:
    """The highest generation of the outer row's pool (older generations are being replaced)."""
    pools = ResourceSlice.objects.filter(
        cluster_id=OuterRef("cluster_id"), driver=OuterRef("driver"), pool=OuterRef("pool")
    )
    return Subquery(pools.order_by("-pool_generation").values("pool_generation")[:1])


def slices() -> QuerySet[ResourceSlice]:
    """Slices with ``current``: whether they are of their pool's highest generation."""
    return ResourceSlice.objects.annotate(newest=newest_generation()).annotate(
        current=ExpressionWrapper(Q(pool_generation__gte=F("newest")), output_field=BooleanField())
    )


def stale_slices() -> Q:
    """Matches devices of slices older than their pool's newest generation (usually none: a pool is
    between generations only while its driver republishes). One query over the slices; filtering by
    these few slice names keeps the device query free of a per-row subquery."""
    newest = Window(Max("pool_generation"), partition_by=[F("cluster_id"), F("driver"), F("pool")])
    rows = (
        ResourceSlice.objects.annotate(newest=newest)
        .filter(pool_generation__lt=F("newest"))
        .values_list("cluster_id", "name")
    )
    by_cluster: dict[int, list[str]] = defaultdict(list)
    for cid, name in rows:
        by_cluster[cid].append(name)
    stale = Q(pk__in=[])
    for cid, names in by_cluster.items():
        stale |= Q(cluster_id=cid, slice_name__in=names)
    return stale


def current_devices() -> QuerySet[Device]:
    """Devices of their pool's highest generation, with the uid of the claim they are allocated to."""
    allocation = _allocations().filter(
        cluster_id=OuterRef("cluster_id"),
        driver=OuterRef("driver"),
        pool=OuterRef("pool"),
        device_name=OuterRef("name"),
    )
    return Device.objects.exclude(stale_slices()).annotate(
        claim_uid=Subquery(allocation.values("claim_uid")[:1])
    )


def claim_names(cluster_uids: set[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """``namespace/name`` of claims by (cluster id, uid), in one query."""
    if not cluster_uids:
        return {}
    rows = ResourceClaim.objects.filter(
        cluster_id__in={c for c, _ in cluster_uids}, uid__in={u for _, u in cluster_uids}
    ).values_list("cluster_id", "uid", "namespace", "name")
    return {(c, u): f"{ns}/{n}" for c, u, ns, n in rows}


def gpus() -> QuerySet[Any]:
    """One row per physical GPU (cluster, gpu uuid): its model, node and device counts, from the per-GPU
    read model (plain indexed rows). What is allocated is added per page by :func:`attach_mig_devices`."""
    return GpuState.objects.values(
        "cluster_id",
        "gpu_uuid",
        "mig_devices",
        "tainted_devices",
        gpu_model=F("model"),
        gpu_product=F("product_name"),
        gpu_node=F("node_name"),
        gpu_index=F("gpu_minor"),
    )


def attach_mig_devices(rows: list[dict[str, Any]]) -> None:
    """Add each GPU row's MIG devices, allocated compute slices and allocated fraction (one query for
    the page: its GPUs' current devices with the claim holding each)."""
    uuids = {r["gpu_uuid"] for r in rows}
    by_gpu: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    used: dict[tuple[int, str], int] = defaultdict(int)
    if uuids:
        devices = (
            current_devices()
            .filter(
                kind__in=("gpu", "mig"), gpu_uuid__in=uuids, cluster_id__in={r["cluster_id"] for r in rows}
            )
            .order_by("name")
            .values(
                "id", "cluster_id", "gpu_uuid", "kind", "name", "mig_profile", "compute_slices", "claim_uid"
            )  # type: ignore[misc]
        )
        for d in devices:
            gpu = (d.pop("cluster_id"), d.pop("gpu_uuid"))
            allocated = d.pop("claim_uid") is not None
            if allocated:
                used[gpu] += d["compute_slices"]
            if d.pop("kind") == "mig":
                by_gpu[gpu].append({**d, "allocated": allocated})
    for r in rows:
        gpu = (r["cluster_id"], r["gpu_uuid"])
        r["mig"] = by_gpu.get(gpu, [])
        r["allocated_slices"] = used.get(gpu, 0)
        r["allocated_fraction"] = round(min(used.get(gpu, 0), FULL_GPU_SLICES) / FULL_GPU_SLICES, 4)


def cluster_names() -> dict[int, str]:
    return dict(Cluster.objects.values_list("id", "name"))


def compute_summary(cluster_id: int | None = None) -> dict[str, Any]:
    """Partition-aware counts per cluster and for the whole fleet (of one cluster with ``cluster_id``), by
    model, MIG profile and state: the per-GPU read model's, two indexed aggregates, kept per process
    until ingest changes a cluster's rows (:func:`fleet.readmodel.summaries`)."""
    per_cluster = readmodel.summaries(readmodel.Scope(None if cluster_id is None else (cluster_id,)))
    names = cluster_names()
    return {
        "clusters": [
            {"cluster": names.get(cid, str(cid)), **s.as_dict()} for cid, s in sorted(per_cluster.items())
        ],
        "total": counts.merge(per_cluster.values()).as_dict(),
    }
