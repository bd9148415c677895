"""Read queries over the fleet tables, shared by pages, API, websocket snapshots and commands.

The counting rules live in pure functions (:func:`summarize`) so the same semantics serve every caller:
- only devices of a pool's highest generation count;
- allocated = named in a claim's allocation results (adminAccess results excluded);
- a physical GPU is counted once, however many MIG slices it carries; its allocated share is measured in
  compute slices out of 7 (static MIG: the N of allocated "Ng" devices; a full-GPU allocation is 7/7).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.apps import apps
from django.db.models import Max

from fleet.models import Device, ResourceSlice
from fleet.normalize import FULL_GPU_SLICES

DeviceKey = tuple[int, str, str, str]  # cluster id, driver, pool, device name


@dataclass
class GroupCount:
    """Devices of one (model, kind, MIG profile) group by state."""

    model: str
    kind: str
    profile: str
    total: int = 0
    allocated: int = 0
    tainted: int = 0
    free: int = 0
    memory_bytes: int = 0  # sum over the group's devices (never added across groups of one GPU)


@dataclass
class ModelTotals:
    """Physical GPUs of one model family, partition-aware."""

    model: str
    gpus: int = 0
    gpus_full: int = 0  # published as a whole GPU (no MIG)
    gpus_mig: int = 0  # carrying MIG slices (static or dynamic)
    compute_slices: int = 0
    compute_slices_allocated: int = 0

    @property
    def allocated_fraction(self) -> float:
        return self.compute_slices_allocated / self.compute_slices if self.compute_slices else 0.0


@dataclass
class FleetSummary:
    groups: list[GroupCount] = field(default_factory=list)
    models: list[ModelTotals] = field(default_factory=list)
    devices: int = 0
    allocated: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for m, totals in zip(data["models"], self.models, strict=True):
            m["allocated_fraction"] = round(totals.allocated_fraction, 4)
        return data


def summarize(devices: Iterable[dict[str, Any]], allocated: set[DeviceKey]) -> FleetSummary:
    """Count devices (dicts with Device's fields) by group and state, and physical GPUs per model."""
    groups: dict[tuple[str, str, str], GroupCount] = {}
    gpu_model: dict[tuple[int, str], str] = {}
    gpu_has_full: set[tuple[int, str]] = set()
    gpu_has_mig: set[tuple[int, str]] = set()
    gpu_used: dict[tuple[int, str], int] = defaultdict(int)
    summary = FleetSummary()
    for d in devices:
        key = (d["model"], d["kind"], d["mig_profile"])
        group = groups.get(key) or groups.setdefault(key, GroupCount(*key))
        is_allocated = (d["cluster_id"], d["driver"], d["pool"], d["name"]) in allocated
        group.total += 1
        group.memory_bytes += d["memory_bytes"] or 0
        if is_allocated:
            group.allocated += 1
        elif d["tainted"]:
            group.tainted += 1
        else:
            group.free += 1
        summary.devices += 1
        summary.allocated += is_allocated
        if d["kind"] in ("gpu", "mig") and d["gpu_uuid"]:
            gpu = (d["cluster_id"], d["gpu_uuid"])
            gpu_model[gpu] = d["model"]
            (gpu_has_mig if d["kind"] == "mig" else gpu_has_full).add(gpu)
            if is_allocated:
                gpu_used[gpu] += d["compute_slices"]
    totals: dict[str, ModelTotals] = {}
    for gpu, model in gpu_model.items():
        t = totals.get(model) or totals.setdefault(model, ModelTotals(model))
        t.gpus += 1
        if gpu in gpu_has_mig:
            t.gpus_mig += 1
        else:
            t.gpus_full += 1
        t.compute_slices += FULL_GPU_SLICES
        t.compute_slices_allocated += min(gpu_used.get(gpu, 0), FULL_GPU_SLICES)
    summary.groups = sorted(groups.values(), key=lambda g: (g.model, g.kind, g.profile))
    summary.models = sorted(totals.values(), key=lambda t: t.model)
    return summary


SUMMARY_FIELDS = (
    "cluster_id", "driver", "pool", "name", "model", "kind", "mig_profile", "memory_bytes", "tainted",
    "gpu_uuid", "compute_slices", "pool_generation",
)  # fmt: skip


def current_devices(cluster_id: int | None = None) -> list[dict[str, Any]]:
    """Devices of each pool's highest generation (older generations are being replaced)."""
    slices = ResourceSlice.objects.all()
    devices = Device.objects.all()
    if cluster_id is not None:
        slices = slices.filter(cluster_id=cluster_id)
        devices = devices.filter(cluster_id=cluster_id)
    newest = {
        (row["cluster_id"], row["driver"], row["pool"]): row["gen"]
        for row in slices.values("cluster_id", "driver", "pool").annotate(gen=Max("pool_generation"))
    }
    return [
        d
        for d in devices.values(*SUMMARY_FIELDS)
        if d["pool_generation"] >= newest.get((d["cluster_id"], d["driver"], d["pool"]), d["pool_generation"])
    ]


def allocated_keys(cluster_id: int | None = None) -> set[DeviceKey]:
    """Devices named in claims' allocation results, adminAccess results excluded."""
    # Read through the app registry: fleet never imports claims, but allocations are facts about devices.
    allocation = apps.get_model("claims", "DeviceAllocation")
    rows = allocation.objects.filter(admin_access=False)
    if cluster_id is not None:
        rows = rows.filter(cluster_id=cluster_id)
    return {tuple(r) for r in rows.values_list("cluster_id", "driver", "pool", "device_name")}  # type: ignore[misc]


def fleet_summary(cluster_id: int | None = None) -> FleetSummary:
    return summarize(current_devices(cluster_id), allocated_keys(cluster_id))
