"""One sampling round of one cluster: read the DCGM samples, join them to the devices, store the round."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Max

from fleet import selectors
from fleet.models import Cluster, Device, DeviceAllocation, ResourceSlice
from usage import ingest
from usage.join import DeviceIndex, DeviceInfo, DeviceRef, entities, join
from usage.prometheus import (
    ENGINE_ACTIVE,
    FB_USED,
    GPU_UTIL,
    EntityRead,
    EntitySource,
    PrometheusSource,
    PrometheusUnavailable,
    SeriesSource,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundReport:
    """What a round did, for the task's log and the tests."""

    ok: bool
    series: int = 0
    matched: int = 0
    unmatched: int = 0
    error: str = ""
    query_seconds: float = 0.0
    round_seconds: float = 0.0


# The last device infos read per cluster in this process, with the cluster's slice version then.
_known: dict[int, tuple[tuple[Any, ...], DeviceIndex]] = {}


def device_infos(cluster_id: int) -> Sequence[DeviceInfo]:
    """The cluster's GPU and MIG devices of each pool's newest generation (see :func:`device_index`)."""
    return device_index(cluster_id).devices


def device_index(cluster_id: int) -> DeviceIndex:
    """The cluster's GPU and MIG devices of each pool's newest generation, indexed as the join needs them.

    Kept between rounds while the cluster's slices are unchanged (``fleet.selectors.cluster_versions``:
    their count and latest write, read before the devices, so a write in between only causes one more
    read): devices change rarely, and reading and indexing 100,000 of them was a tenth of a round's CPU
    time."""
    version = tuple(selectors.cluster_versions([cluster_id]).get(cluster_id, ())[:2])
    known = _known.get(cluster_id)
    if known is not None and version and known[0] == version:
        return known[1]
    index = DeviceIndex.of(_read_device_infos(cluster_id))
    _known[cluster_id] = (version, index)
    return index


# What the join reads of a device, in ``_device_info``'s order.
_DEVICE_COLUMNS = (
    "driver", "pool", "name", "kind", "uuid", "gpu_uuid", "mig_profile", "model", "node_name",
    "compute_slices", "gpu_minor", "pool_generation",
)  # fmt: skip


def _read_device_infos(cluster_id: int, gpu_uuids: Collection[str] | None = None) -> list[DeviceInfo]:
    """The devices of each pool's newest generation (the rule of ``fleet.selectors.current_devices``:
    older generations are being replaced; a pool without slices keeps its devices), reading only the
    columns the join needs, as tuples: the heatmap's selector read three times as much (counters, taints,
    memory) as dicts, and its rows were most of a round's transient memory. ``gpu_uuids``: only the
    devices of these physical GPUs (whole, or their MIG devices)."""
    generations = (
        ResourceSlice.objects.filter(cluster_id=cluster_id)
        .values_list("driver", "pool")
        .annotate(newest=Max("pool_generation"))
        .order_by()
    )
    newest = {(driver, pool): generation for driver, pool, generation in generations}
    devices = Device.objects.filter(cluster_id=cluster_id, kind__in=("gpu", "mig"))
    if gpu_uuids is not None:
        devices = devices.filter(gpu_uuid__in=list(gpu_uuids))
    rows = devices.values_list(*_DEVICE_COLUMNS)
    out: list[DeviceInfo] = []
    append = out.append
    # One string per distinct value (driver, pools, nodes, models, profiles, a MIG device's parent GPU)
    # rather than one per device: the infos are kept between rounds.
    seen: dict[str, str] = {}
    share = seen.setdefault
    # ``iterator``: rows are read in chunks (a server-side cursor on PostgreSQL), not all held at once.
    for row in rows.iterator(chunk_size=5000):
        driver, pool, name, kind, uuid, gpu_uuid, profile, model, node, slices, minor, generation = row
        if generation < newest.get((driver, pool), generation):
            continue
        append(
            DeviceInfo(
                (share(driver, driver), share(pool, pool), name),
                share(kind, kind),
                uuid or "",
                share(gpu_uuid, gpu_uuid) if gpu_uuid else "",
                share(profile, profile) if profile else "",
                share(model, model) if model else "",
                share(node, node) if node else "",
                (slices or 7) / 7 if kind == "mig" else 1.0,
                minor,
            )
        )
    return out


def holdings(cluster_id: int, pools: Collection[str] | None = None) -> dict[DeviceRef, list[tuple[str, str]]]:
    """Who holds each device (of these ``pools``, default all): (namespace, claim) per device, by the
    fleet's allocation rule."""
    return {
        (driver, pool, device): [(h.namespace, h.name) for h in holders]
        for (_, driver, pool, device), holders in selectors.allocation_holders([cluster_id], pools).items()
    }


# Enough to know every entity an exporter reports: GPUs report activity (one of the two) and memory, MIG
# instances activity and memory.
_NAMING_METRICS = (ENGINE_ACTIVE, GPU_UTIL, FB_USED)


def claim_instances(
    cluster_id: int, namespace: str, claim: str, source: PrometheusSource
) -> list[tuple[str, str]]:
    """(GPU UUID, GPU_I_ID) of each exporter entity that is one of the claim's devices now (``GPU_I_ID``
    empty for a whole GPU), joined as a round joins them (:func:`usage.join.join`) over the physical GPUs
    the claim holds all or part of: the same devices, holders and entities of those GPUs give the same
    matches. Dynamic-MIG series carry no DRA labels, so a claim's charts find them only this way."""
    refs = set(
        DeviceAllocation.objects.filter(
            cluster_id=cluster_id, claim__namespace=namespace, claim__name=claim, admin_access=False
        ).values_list("driver", "pool", "device_name")
    )
    if not refs:
        return []
    pools = {pool for _, pool, _ in refs}
    gpus = {
        gpu
        for driver, pool, name, gpu in Device.objects.filter(
            cluster_id=cluster_id, pool__in=pools, name__in={name for _, _, name in refs}
        ).values_list("driver", "pool", "name", "gpu_uuid")
        if (driver, pool, name) in refs and gpu
    }
    # UUIDs are hex and dashes: anything else is left out rather than put into a regular expression.
    safe = sorted(u for u in gpus if all(c.isalnum() or c == "-" for c in u))
    if not safe:
        return []
    index = DeviceIndex.of(_read_device_infos(cluster_id, safe))
    held = {ref: owners for ref, owners in holdings(cluster_id, pools).items() if ref in index.by_ref}
    # Case-insensitive: the join compares UUIDs so (NVML's and the DRA driver's spellings differ).
    answer = source.entities(f'UUID=~"(?i){"|".join(safe)}"', _NAMING_METRICS, ("",))
    matched = join(answer.entities, index, held).measured
    return sorted((m.gpu_uuid, m.instance_id) for ref, m in matched.items() if ref in refs)


def read(source: SeriesSource | EntitySource) -> EntityRead:
    """The source's entities: grouped by the source itself when it can (Prometheus), else from its
    samples."""
    if hasattr(source, "entities"):
        return source.entities()
    samples, seconds = source.samples()
    return EntityRead(entities(samples), len(samples), seconds)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a round runs.

    A round on a large fleet builds a few hundred thousand objects (entities, device infos, rows) that all
    live until its end; every allocation threshold crossed made the collector walk them all again,
    finding nothing to free: about a third of the round's CPU time. They hold no reference cycles and
    are freed by reference counting when the round returns."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def sample_cluster(
    cluster: Cluster, source: SeriesSource | EntitySource, at: datetime, limits: ingest.Thresholds
) -> RoundReport:
    """Run one round. A source that cannot answer is recorded (``unavailable_since``) and nothing else
    changes; the round never raises for it."""
    with collector_paused():
        return _round(cluster, source, at, limits)


def _round(
    cluster: Cluster, source: SeriesSource | EntitySource, at: datetime, limits: ingest.Thresholds
) -> RoundReport:
    started = time.monotonic()
    # The fleet first: reading it briefly takes more memory than what it keeps (the selector's rows),
    # and that peak then passes before the source's answer is held.
    devices = device_index(cluster.pk)
    held = holdings(cluster.pk)
    try:
        answer = read(source)
    except PrometheusUnavailable as exc:
        log.warning("utilization of cluster %s unavailable: %s", cluster.name, exc)
        ingest.record_failure(cluster, at, str(exc))
        return RoundReport(ok=False, error=str(exc))
    result = join(answer.entities, devices, held)
    result.series = answer.series
    query_seconds = answer.seconds
    del answer  # the entities: what the rows need is in ``result`` now; their memory serves the writing
    elapsed = time.monotonic() - started
    ingest.record_round(cluster, at, result, devices.devices, held, limits, query_seconds, elapsed)
    unmatched = sum(result.unmatched.values())
    if unmatched:
        log.info(
            "cluster %s: %d DCGM entities matched no device: %s",
            cluster.name,
            unmatched,
            dict(result.unmatched),
        )
    return RoundReport(
        True,
        result.series,
        len(result.measured),
        unmatched,
        "",
        query_seconds,
        time.monotonic() - started,
    )
