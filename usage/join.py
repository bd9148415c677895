"""Joining DCGM samples to the fleet's devices (pure functions: no ORM, no I/O).

dcgm-exporter reports one entity per GPU or MIG instance; every metric of that entity carries the same
labels. An entity is matched to a device, in this order:

1. by its DRA labels ``(dra_driver_name, dra_pool_name, dra_device_name)`` (devices some claim holds);
2. by ``dra_mig_device_uuid`` against the MIG device's ``uuid`` (NVML's ``MIG-…`` against the driver's
   lower-cased ``mig-…``: compared case-insensitively);
3. a MIG instance without DRA labels (dynamic MIG, or a free static slice) by its parent ``UUID`` and
   ``GPU_I_PROFILE``: the only device of that profile on that GPU, else the only one held and not matched
   yet; free instances of one profile on one GPU are interchangeable, so they take the free devices in
   order; otherwise it is ambiguous;
4. a full GPU by ``UUID``.

An entity that matches nothing is counted by reason and kept as an example, never dropped silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from usage.prometheus import ENGINE_ACTIVE, FB_FREE, FB_USED, GPU_UTIL, POWER, Entity, SampleLike

DeviceRef = tuple[str, str, str]  # driver, pool, device name
MIB = 1024 * 1024
EXAMPLES = 20
# Labels Prometheus or a relabelling adds per target: not part of the entity's identity.
_TARGET_LABELS = ("job", "instance")


class DeviceInfo(NamedTuple):
    """What the join needs of a fleet device (a named tuple: a round builds one per device of the
    cluster, and a tuple is built several times faster than a frozen dataclass)."""

    ref: DeviceRef
    kind: str  # "gpu" or "mig"
    uuid: str
    gpu_uuid: str
    profile: str
    model: str
    node: str
    gpu_fraction: float
    minor: int | None = None  # the physical GPU's index on its node (the heatmap's column)


class Measured(NamedTuple):
    """One device's values this round; ``active`` is None when no activity metric was reported."""

    ref: DeviceRef
    matched_by: str
    gpu_uuid: str
    instance_id: str
    active: float | None
    fb_used_bytes: int | None
    fb_total_bytes: int | None
    power_watts: float | None


@dataclass(frozen=True)
class DeviceIndex:
    """Devices as the join looks them up: by key, by (lower-cased) UUID, MIG devices by (parent GPU UUID,
    profile). Built once per device list: the sampler keeps it with the list between rounds."""

    devices: Sequence[DeviceInfo]
    by_ref: dict[DeviceRef, DeviceInfo]
    by_uuid: dict[str, DeviceInfo]
    migs: dict[tuple[str, str], list[DeviceInfo]]

    @classmethod
    def of(cls, devices: Iterable[DeviceInfo]) -> DeviceIndex:
        listed = list(devices)
        by_ref: dict[DeviceRef, DeviceInfo] = {}
        by_uuid: dict[str, DeviceInfo] = {}
        migs: dict[tuple[str, str], list[DeviceInfo]] = {}
        for d in listed:
            by_ref[d.ref] = d
            if d.uuid:
                by_uuid[d.uuid.lower()] = d
            if d.kind == "mig":
                migs.setdefault((d.gpu_uuid.lower(), d.profile), []).append(d)
        return cls(listed, by_ref, by_uuid, migs)


@dataclass
class JoinResult:
    measured: dict[DeviceRef, Measured] = field(default_factory=dict)
    unmatched: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, str]] = field(default_factory=list)
    entities: int = 0
    series: int = 0


def entities(samples: Iterable[SampleLike]) -> list[Entity]:
    """Group samples by their entity's labels (all metrics of one GPU/MIG instance share them), for
    sources that return plain samples (Prometheus groups them itself: ``PrometheusSource.entities``)."""
    grouped: dict[tuple[tuple[str, str], ...], Entity] = {}
    for s in samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in _TARGET_LABELS))
        entity = grouped.get(key)
        if entity is None:
            entity = grouped[key] = Entity(dict(key))
        entity.values[s.metric] = s.value
    return list(grouped.values())


def _measured(entity: Entity, ref: DeviceRef, how: str) -> Measured:
    v = entity.values
    active: float | None = None
    if ENGINE_ACTIVE in v:
        active = min(max(v[ENGINE_ACTIVE], 0.0), 1.0)
    elif GPU_UTIL in v:
        active = min(max(v[GPU_UTIL] / 100.0, 0.0), 1.0)
    used = int(v[FB_USED] * MIB) if FB_USED in v else None
    total = int((v[FB_USED] + v[FB_FREE]) * MIB) if FB_USED in v and FB_FREE in v else None
    return Measured(
        ref,
        how,
        entity.labels.get("UUID", ""),
        entity.labels.get("GPU_I_ID", ""),
        active,
        used,
        total,
        v.get(POWER),
    )


def join(
    all_entities: Iterable[Entity],
    devices: Iterable[DeviceInfo] | DeviceIndex,
    held: Mapping[DeviceRef, object],
) -> JoinResult:
    """Match every entity to one of ``devices`` (see the module docstring).

    ``held`` is the set of devices some claim holds (its keys are used). ``series`` of the result is the
    caller's to fill (the source knows how many series it read)."""
    result = JoinResult()
    index = devices if isinstance(devices, DeviceIndex) else DeviceIndex.of(devices)
    by_ref, by_uuid, migs = index.by_ref, index.by_uuid, index.migs
    # Entities without DRA labels, matched after every DRA-labelled one has claimed its device: MIG
    # instances (whose order decides which free instance takes which free device) and whole GPUs (matched
    # by UUID alone: no order to keep but their own).
    instances: list[Entity] = []
    whole: list[Entity] = []

    def miss(reason: str, entity: Entity) -> None:
        result.unmatched[reason] += 1
        if len(result.examples) < EXAMPLES:
            result.examples.append({"reason": reason, **entity.labels})

    measured = result.measured

    def hit(entity: Entity, ref: DeviceRef, how: str) -> None:
        if ref in measured:
            miss("two series for one device", entity)
        else:
            measured[ref] = _measured(entity, ref, how)

    count = 0
    for e in all_entities:
        count += 1
        labels = e.labels
        get = labels.get
        driver, pool, device = get("dra_driver_name"), get("dra_pool_name"), get("dra_device_name")
        if driver and pool and device:
            ref = (driver, pool, device)
            if ref in by_ref:
                hit(e, ref, "dra")
            else:
                miss("DRA device not in the fleet", e)
        elif labels.get("dra_mig_device_uuid"):
            found = by_uuid.get(labels["dra_mig_device_uuid"].lower())
            if found is not None:
                hit(e, found.ref, "mig-uuid")
            else:
                miss("MIG UUID not in the fleet", e)
        elif get("GPU_I_ID"):
            instances.append(e)
        else:
            whole.append(e)
    result.entities = count
    instances.sort(key=lambda e: (e.labels.get("UUID", ""), e.labels["GPU_I_ID"].zfill(4)))
    no_devices: list[DeviceInfo] = []
    for e in instances:
        labels = e.labels
        free = migs.get((labels.get("UUID", "").lower(), labels.get("GPU_I_PROFILE", "")), no_devices)
        candidates = [d for d in free if d.ref not in measured]
        if not candidates:
            miss("MIG instance of an unknown GPU or profile", e)
        elif len(candidates) == 1:
            hit(e, candidates[0].ref, "mig-profile")
        else:
            held_ones = [d for d in candidates if d.ref in held]
            if len(held_ones) == 1:
                hit(e, held_ones[0].ref, "mig-profile")
            elif not held_ones:
                hit(e, min(d.ref for d in candidates), "mig-free")
            else:
                miss("MIG instance without DRA labels, several held", e)
    for e in whole:
        found = by_uuid.get(e.labels.get("UUID", "").lower())
        if found is not None and found.kind == "gpu":
            hit(e, found.ref, "uuid")
        else:
            miss("GPU UUID not in the fleet", e)
    return result
