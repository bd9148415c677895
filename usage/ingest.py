"""The only writer of the usage tables: one sampling round per call, in one transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from fleet.models import Cluster
from usage.cells import gpu_cells
from usage.cells import store as store_cells
from usage.join import DeviceInfo, DeviceRef, JoinResult
from usage.models import ClaimUsage, DeviceUsage, SamplingState, UsageTrend


@dataclass(frozen=True)
class Thresholds:
    """Idle = held and activity below ``below`` (0..1) for at least ``window``; ``interval`` is the
    sampling period (a longer silence between rounds counts at most two periods)."""

    below: float
    window: timedelta
    interval: timedelta


Holding = tuple[str, str]  # namespace, claim name


def record_failure(cluster: Cluster, at: datetime, error: str) -> None:
    """A round that could not read its source: keep every stored value, remember since when."""
    with transaction.atomic():
        state, _ = SamplingState.objects.select_for_update().get_or_create(cluster=cluster)
        state.last_round_at = at
        state.last_error = error[:2000]
        state.unavailable_since = state.unavailable_since or at
        state.save()


def record_round(
    cluster: Cluster,
    at: datetime,
    result: JoinResult,
    devices: Sequence[DeviceInfo],
    held: Mapping[DeviceRef, Sequence[Holding]],
    limits: Thresholds,
    query_seconds: float,
    round_seconds: float,
) -> None:
    """Store a round: every measured or held device's latest values (a held device without a value is a
    gap: ``active`` null), each holding's idle accounting, the trend points and the sampling state."""
    info = {d.ref: d for d in devices}
    with transaction.atomic():
        # Every holding of the claims held now, however long ago it was last seen (a Prometheus outage
        # must not restart a holding's accounting).
        claims = sorted({claim for owners in held.values() for _, claim in owners})
        previous = {
            (h.namespace, h.claim, h.driver, h.pool, h.device): h
            for h in ClaimUsage.objects.filter(cluster=cluster, claim__in=claims)
        }
        rows: list[DeviceUsage] = []
        holdings: list[ClaimUsage] = []
        trend: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        for ref in sorted(set(result.measured) | set(held)):
            m = result.measured.get(ref)
            d = info.get(ref)
            active = m.active if m else None
            owners = held.get(ref) or ()
            starts: list[datetime | None] = []
            for namespace, claim in owners:
                h = previous.get((namespace, claim, *ref))
                holding = _account(cluster, at, ref, d, namespace, claim, active, h, limits)
                holdings.append(holding)
                starts.append(holding.idle_since)
                if d is not None:
                    point = trend[(d.model, namespace)]
                    share = d.gpu_fraction / len(owners)
                    point[0] += share
                    if active is not None:
                        point[1] += share
                        point[2] += share * active
                        if holding.idle_since is not None and at - holding.idle_since >= limits.window:
                            point[3] += share
            namespace, claim = owners[0] if owners else ("", "")
            rows.append(
                DeviceUsage(
                    cluster=cluster,
                    driver=ref[0],
                    pool=ref[1],
                    device=ref[2],
                    gpu_uuid=m.gpu_uuid if m else (d.gpu_uuid if d else ""),
                    instance_id=m.instance_id if m else "",
                    matched_by=m.matched_by if m else "",
                    namespace=namespace,
                    claim=claim,
                    active=active,
                    fb_used_bytes=m.fb_used_bytes if m else None,
                    fb_total_bytes=m.fb_total_bytes if m else None,
                    power_watts=m.power_watts if m else None,
                    sampled_at=at,
                    # A shared device is idle while every holder's stretch is: since the latest start.
                    idle_since=max(t for t in starts if t) if starts and None not in starts else None,
                )
            )
        DeviceUsage.objects.filter(cluster=cluster).delete()
        DeviceUsage.objects.bulk_create(rows, batch_size=2000)
        ClaimUsage.objects.bulk_create(
            holdings,
            batch_size=2000,
            update_conflicts=True,
            unique_fields=["cluster", "namespace", "claim", "driver", "pool", "device"],
            update_fields=[
                "node",
                "model",
                "profile",
                "gpu_fraction",
                "last_seen",
                "samples",
                "gap_samples",
                "active_sum",
                "observed_seconds",
                "idle_seconds",
                "idle_since",
            ],
        )
        minute = at.replace(second=0, microsecond=0)
        UsageTrend.objects.bulk_create(
            [
                UsageTrend(
                    time=minute,
                    cluster=cluster,
                    model=model,
                    namespace=namespace,
                    allocated=v[0],
                    measured=v[1],
                    active=v[2],
                    idle=v[3],
                )
                for (model, namespace), v in sorted(trend.items())
            ],
            update_conflicts=True,
            unique_fields=["cluster", "model", "namespace", "resolution", "time"],
            update_fields=["allocated", "measured", "active", "idle"],
        )
        cells = gpu_cells(
            cluster.name,
            devices,
            {ref: m.active for ref, m in result.measured.items()},
            {(r.driver, r.pool, r.device): r.idle_since for r in rows if r.idle_since},
            at,
            limits.window,
        )
        transaction.on_commit(lambda: store_cells(cluster, cells, at))
        state, _ = SamplingState.objects.select_for_update().get_or_create(cluster=cluster)
        state.last_round_at = state.last_ok_at = at
        state.unavailable_since = None
        state.last_error = ""
        state.series = result.series
        state.matched = len(result.measured)
        state.unmatched = dict(result.unmatched)
        state.unmatched_examples = result.examples
        state.query_seconds = query_seconds
        state.round_seconds = round_seconds
        state.save()


def _account(
    cluster: Cluster,
    at: datetime,
    ref: DeviceRef,
    d: DeviceInfo | None,
    namespace: str,
    claim: str,
    active: float | None,
    h: ClaimUsage | None,
    limits: Thresholds,
) -> ClaimUsage:
    """The holding's row after this round (pure apart from building the object)."""
    if h is None:
        h = ClaimUsage(
            cluster=cluster,
            namespace=namespace,
            claim=claim,
            driver=ref[0],
            pool=ref[1],
            device=ref[2],
            first_seen=at,
            last_seen=at,
            gpu_fraction=1.0,
        )
        elapsed = 0.0
    else:
        elapsed = min((at - h.last_seen).total_seconds(), 2 * limits.interval.total_seconds())
    h.node = d.node if d else h.node
    h.model = d.model if d else (h.model or "")
    h.profile = d.profile if d else h.profile
    h.gpu_fraction = d.gpu_fraction if d else h.gpu_fraction
    h.last_seen = at
    if active is None:
        h.gap_samples += 1  # a gap: neither idle nor busy, and the idle stretch neither starts nor ends
        return h
    h.samples += 1
    h.active_sum += active
    h.observed_seconds += elapsed
    if active < limits.below:
        h.idle_seconds += elapsed
        h.idle_since = h.idle_since or at
    else:
        h.idle_since = None
    return h
