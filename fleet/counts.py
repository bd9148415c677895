"""The one definition of every fleet count: home, the overview, the heatmap, ``fleet_summary`` and the API
all count through this module (pure functions; the selectors read the rows, this module judges them).

A device (``cluster, driver, pool, name``) is in exactly one **state**, the first that applies of:

- **reserved**: allocated to a claim whose ``reservedFor`` names a consumer (in use);
- **allocated** (unreserved): allocated, no consumer (a suspected leak when it lasts);
- **unavailable**: not allocated and not allocatable now: it carries a NoSchedule/NoExecute taint (its
  own, or one a DeviceTaintRule applies: ``Device.taints`` holds both), or
  (dynamic MIG) the shared counters it needs are used up by allocated siblings;
- **free**: everything else.

So ``total = free + allocated + unavailable`` (``allocated`` includes ``reserved``). **Tainted** is not a
state but an attribute: devices carrying a NoSchedule/NoExecute taint, whatever their state. A tainted
device in use keeps running; the scheduler places nothing new on it.

A **physical GPU** is a full-GPU device or the parent of MIG devices, counted once. It is *whole only*
(published as one device), *static MIG* (carved into fixed MIG devices), or *partitionable* (dynamic MIG:
the whole GPU and its possible partitions are published; the allocator picks). *Allocated whole*: its
full-GPU device is allocated. *Tainted*: one of its devices is tainted (the heatmap's cross).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet.normalize import FULL_GPU_SLICES
from fleet.taint_rules import rule_text

DeviceKey = tuple[int, str, str, str]  # cluster id, driver, pool, device name

# Part of the cache keys of computed counts: change it with the shape or meaning of a count, so that a
# deployment never serves counts cached by the previous code.
DEFINITIONS_VERSION = 2

TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # PreferNoSchedule does not keep claims away
STATES = ("free", "reserved", "allocated", "unavailable")


def is_tainted(taints: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a device's taints keep new allocations away (ingest stores it as ``Device.tainted``)."""
    return any(t.get("effect") in TAINT_EFFECTS for t in taints)


def taint_text(taints: Iterable[Mapping[str, Any]]) -> list[str]:
    """Taints as ``key=value:Effect`` (`` by DeviceTaintRule NAME`` when a rule applied it), for pages
    and hover cards."""
    out = []
    for t in taints:
        value = f"={t['value']}" if t.get("value") else ""
        out.append(f"{t.get('key', '')}{value}:{t.get('effect', '')}{rule_text(t)}")
    return out


def device_state(allocated: bool, reserved: bool, blocked: bool, tainted: bool) -> str:
    """A device's state on device lists and MIG slots: reserved, allocated, tainted or unavailable (the
    two reasons of the *unavailable* count, told apart), free. ``blocked``: its counters are used up."""
    if allocated:
        return "reserved" if reserved else "allocated"
    if blocked:
        return "unavailable"
    return "tainted" if tainted else "free"


@dataclass
class GroupCount:
    """Devices of one (model, kind, MIG profile) group by state (module docstring)."""

    model: str
    kind: str
    profile: str
    total: int = 0
    allocated: int = 0  # reserved or not
    reserved: int = 0
    unavailable: int = 0  # not allocated and not allocatable: tainted, or its counters are used up
    tainted: int = 0  # carrying a NoSchedule/NoExecute taint, in any state
    free: int = 0
    memory_bytes: int = 0  # sum over the group's devices (never added across groups of one GPU)

    @property
    def unreserved(self) -> int:
        return self.allocated - self.reserved

    def add(
        self, *, allocated: bool, reserved: bool, blocked: bool, tainted: bool, memory: int | None
    ) -> None:
        """Count one device (``memory``: its bytes when they count, see :func:`counts_memory`)."""
        self.total += 1
        self.memory_bytes += memory or 0
        self.tainted += tainted
        if allocated:
            self.allocated += 1
            self.reserved += reserved
        elif blocked or tainted:
            self.unavailable += 1
        else:
            self.free += 1


def counts_memory(allocated: bool, consumes_counters: bool) -> bool:
    """Whether a device's memory adds to its group's: dynamic-MIG placements overlap (seven 1g placements
    share one GPU's memory), so only the allocated ones hold memory."""
    return allocated or not consumes_counters


@dataclass
class ModelTotals:
    """Physical GPUs of one model family, partition-aware (module docstring)."""

    model: str
    gpus: int = 0
    gpus_full: int = 0  # whole only: published as one device, no MIG
    gpus_mig: int = 0  # carrying MIG devices, static or dynamic
    gpus_dynamic: int = 0  # of gpus_mig: partitionable (dynamic MIG)
    gpus_whole_allocated: int = 0  # its full-GPU device is allocated
    gpus_tainted: int = 0  # one of its devices is tainted
    compute_slices: int = 0
    compute_slices_allocated: int = 0

    @property
    def gpus_static_mig(self) -> int:
        return self.gpus_mig - self.gpus_dynamic

    @property
    def allocated_fraction(self) -> float:
        return self.compute_slices_allocated / self.compute_slices if self.compute_slices else 0.0

    def add_gpu(self, *, mig: bool, dynamic: bool, whole_allocated: bool, tainted: bool, used: int) -> None:
        """Count one physical GPU; ``used``: compute slices of its allocated devices (capped at 7)."""
        self.gpus += 1
        self.gpus_mig += mig
        self.gpus_full += not mig
        self.gpus_dynamic += mig and dynamic
        self.gpus_whole_allocated += whole_allocated
        self.gpus_tainted += tainted
        self.compute_slices += FULL_GPU_SLICES
        self.compute_slices_allocated += min(used, FULL_GPU_SLICES)


@dataclass
class FleetSummary:
    groups: list[GroupCount] = field(default_factory=list)
    models: list[ModelTotals] = field(default_factory=list)
    devices: int = 0
    allocated: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for m, totals in zip(data["models"], self.models, strict=True):
            m["gpus_static_mig"] = totals.gpus_static_mig
            m["allocated_fraction"] = round(totals.allocated_fraction, 4)
        return data


@dataclass
class GpuFlags:
    """One physical GPU as :meth:`ModelTotals.add_gpu` counts it, with what the pages show of it."""

    model: str
    mig: bool = False
    dynamic: bool = False
    whole: bool = False  # its full-GPU device is allocated
    tainted: bool = False
    used: int = 0  # compute slices of its allocated devices (uncapped)


@dataclass
class Unit:
    """The devices of one physical GPU (``gpu`` is set), or one device outside any GPU (no ``gpu_uuid``,
    or not a GPU/MIG device), counted by group: the smallest part of the fleet whose counts the per-GPU
    read model stores. Summing units gives :func:`summarize`."""

    groups: dict[tuple[str, str, str], GroupCount] = field(default_factory=dict)
    gpu: GpuFlags | None = None
    devices: int = 0
    allocated: int = 0


UnitKey = tuple[int, str]  # cluster id, "gpu:<uuid>" or "device:<driver>/<pool>/<name>"


def unit_key(d: Mapping[str, Any]) -> UnitKey:
    """The unit a device counts in: its physical GPU, or itself."""
    if d["kind"] in ("gpu", "mig") and d["gpu_uuid"]:
        return d["cluster_id"], f"gpu:{d['gpu_uuid']}"
    return d["cluster_id"], f"device:{d['driver']}/{d['pool']}/{d['name']}"


def units(
    devices: Iterable[Mapping[str, Any]],
    allocated: Collection[DeviceKey],
    reserved: Collection[DeviceKey],
    blocked: Collection[DeviceKey],
) -> dict[UnitKey, Unit]:
    """Count devices (dicts with Device's fields) by unit (:func:`unit_key`), group and state.

    ``allocated``: keys named by claims' allocation results; ``reserved``: those of them held by a reserved
    claim; ``blocked``: unallocated keys whose counters are used up (``selectors.unavailable_devices``)."""
    out: dict[UnitKey, Unit] = {}
    for d in devices:
        ukey = unit_key(d)
        unit = out.get(ukey) or out.setdefault(ukey, Unit())
        key = (d["model"], d["kind"], d["mig_profile"])
        group = unit.groups.get(key) or unit.groups.setdefault(key, GroupCount(*key))
        device_key = (d["cluster_id"], d["driver"], d["pool"], d["name"])
        is_allocated = device_key in allocated
        consumes = bool(d["counters_consumed"] or d.get("has_counters"))
        group.add(
            allocated=is_allocated,
            reserved=is_allocated and device_key in reserved,
            blocked=not is_allocated and device_key in blocked,
            tainted=bool(d["tainted"]),
            memory=d["memory_bytes"] if counts_memory(is_allocated, consumes) else 0,
        )
        unit.devices += 1
        unit.allocated += is_allocated
        if ukey[1].startswith("gpu:"):
            gpu = unit.gpu or GpuFlags(d["model"])
            unit.gpu = gpu
            gpu.model = d["model"]
            if d["kind"] == "mig":
                gpu.mig = True
                gpu.dynamic |= consumes
            gpu.whole |= d["kind"] == "gpu" and is_allocated
            gpu.tainted |= bool(d["tainted"])
            if is_allocated:
                gpu.used += d["compute_slices"]
    return out


def summarize(
    devices: Iterable[Mapping[str, Any]],
    allocated: Collection[DeviceKey],
    reserved: Collection[DeviceKey],
    blocked: Collection[DeviceKey],
) -> FleetSummary:
    """Count devices (dicts with Device's fields) by group and state, and physical GPUs per model: the sum
    of their :func:`units` (same arguments)."""
    groups: dict[tuple[str, str, str], GroupCount] = {}
    totals: dict[str, ModelTotals] = {}
    summary = FleetSummary()
    for unit in units(devices, allocated, reserved, blocked).values():
        summary.devices += unit.devices
        summary.allocated += unit.allocated
        for key, g in unit.groups.items():
            acc = groups.setdefault(key, GroupCount(*key))
            for name in _GROUP_ADDITIVE:
                setattr(acc, name, getattr(acc, name) + getattr(g, name))
        if unit.gpu is not None:
            gpu = unit.gpu
            t = totals.get(gpu.model) or totals.setdefault(gpu.model, ModelTotals(gpu.model))
            t.add_gpu(mig=gpu.mig, dynamic=gpu.dynamic, whole_allocated=gpu.whole, tainted=gpu.tainted,
                      used=gpu.used)  # fmt: skip
    summary.groups = sorted(groups.values(), key=lambda g: (g.model, g.kind, g.profile))
    summary.models = sorted(totals.values(), key=lambda t: t.model)
    return summary


_GROUP_ADDITIVE = ("total", "allocated", "reserved", "unavailable", "tainted", "free", "memory_bytes")
_MODEL_ADDITIVE = (
    "gpus", "gpus_full", "gpus_mig", "gpus_dynamic", "gpus_whole_allocated", "gpus_tainted",
    "compute_slices", "compute_slices_allocated",
)  # fmt: skip


def merge(summaries: Iterable[FleetSummary]) -> FleetSummary:
    """The sum of per-cluster summaries (every count is additive across clusters)."""
    groups: dict[tuple[str, str, str], GroupCount] = {}
    models: dict[str, ModelTotals] = {}
    total = FleetSummary()
    for s in summaries:
        total.devices += s.devices
        total.allocated += s.allocated
        for g in s.groups:
            key = (g.model, g.kind, g.profile)
            acc = groups.setdefault(key, GroupCount(*key))
            for name in _GROUP_ADDITIVE:
                setattr(acc, name, getattr(acc, name) + getattr(g, name))
        for m in s.models:
            mt = models.setdefault(m.model, ModelTotals(m.model))
            for name in _MODEL_ADDITIVE:
                setattr(mt, name, getattr(mt, name) + getattr(m, name))
    total.groups = sorted(groups.values(), key=lambda g: (g.model, g.kind, g.profile))
    total.models = sorted(models.values(), key=lambda t: t.model)
    return total


# What each column means, for the pages' headers (``<abbr title>``) and legends: the module docstring's
# definitions in a sentence each.
LEGEND: dict[str, str] = {
    "gpus": "Physical GPUs: a full-GPU device or the parent of MIG devices, counted once.",
    "gpus_full": "Whole only: GPUs published as one device, without MIG.",
    "gpus_static_mig": "Static MIG: GPUs carved into fixed MIG devices.",
    "gpus_dynamic": "Partitionable (dynamic MIG): the whole GPU and its possible partitions are published; "
    "the allocator picks one.",
    "gpus_whole_allocated": "Allocated whole: GPUs whose full-GPU device is allocated (any kind of GPU).",
    "gpus_tainted": "Tainted: GPUs with a NoSchedule/NoExecute taint on one of their devices, in any state.",
    "compute_slices": "Allocated compute slices out of 7 per GPU (a whole-GPU allocation is 7/7; MIG "
    "devices count their slices, never their GPU's memory again).",
    "total": "Devices published in the pools' current generation.",
    "free": "Not allocated and allocatable now.",
    "reserved": "Allocated to a claim reserved for a consumer (in use).",
    "unreserved": "Allocated to a claim no consumer uses: a suspected leak when it lasts.",
    "allocated": "Named in a claim's allocation results (reserved or not; adminAccess excluded).",
    "unavailable": "Not allocated and not allocatable now: tainted, or (dynamic MIG) the shared counters it "
    "needs are used by allocated partitions of its GPU.",
    "tainted": "Carrying a NoSchedule/NoExecute taint, in any state (also counted in its state's column).",
    "memory": "The devices' memory (dynamic MIG: only allocated partitions, which overlap), in binary units.",
}
