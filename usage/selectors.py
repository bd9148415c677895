"""Read queries of the usage tables: idle allocations, device values for pages, trends, sampling state."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from usage.models import ClaimUsage, DeviceUsage, SamplingState, UsageTrend


@dataclass
class IdleClaim:
    """A claim that held GPUs while (mostly) idle, with the waste it caused."""

    cluster: str
    namespace: str
    claim: str
    model: str
    profile: str
    nodes: list[str]
    devices: int
    gpus: float
    idle_since: datetime | None
    idle_gpu_hours: float
    observed_hours: float
    mean_active_percent: float | None
    gap_samples: int
    first_seen: datetime
    last_seen: datetime
    device_names: list[str] = field(default_factory=list)
    blocked: int = 0
    blocked_examples: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Waste:
    """Idle GPU-hours of one (namespace, model) group."""

    namespace: str
    model: str
    claims: int
    idle_gpu_hours: float


def holdings(
    since: datetime, until: datetime, clusters: Iterable[int] | None = None, visible: Q | None = None
) -> QuerySet[ClaimUsage]:
    """Holdings seen between ``since`` and ``until``; ``visible`` (on namespace) limits what a user sees."""
    rows = ClaimUsage.objects.filter(last_seen__gte=since, first_seen__lte=until)
    if clusters is not None:
        rows = rows.filter(cluster_id__in=list(clusters))
    if visible is not None:
        rows = rows.filter(visible)
    return rows


def idle_claims(
    since: datetime,
    until: datetime,
    below_percent: float,
    window: timedelta,
    clusters: Iterable[int] | None = None,
    visible: Q | None = None,
) -> list[IdleClaim]:
    """Claims that held GPUs idle in the window: idle now for at least ``window``, or with a mean
    activity below ``below_percent`` over the samples taken. Largest waste first.

    Idle GPU-hours are counted over each holding's life (the rounds that saw it allocated); a device's
    share is its fraction of a GPU (a 1g MIG slice is 1/7). Gaps count as neither idle nor busy."""
    grouped: dict[tuple[str, str, str], list[ClaimUsage]] = defaultdict(list)
    for h in holdings(since, until, clusters, visible).select_related("cluster").order_by("device"):
        grouped[(h.cluster.name, h.namespace, h.claim)].append(h)
    out: list[IdleClaim] = []
    for (cluster, namespace, claim), rows in grouped.items():
        samples = sum(r.samples for r in rows)
        mean = (sum(r.active_sum for r in rows) / samples * 100.0) if samples else None
        starts = [r.idle_since for r in rows]
        idle_since = max(t for t in starts if t) if starts and None not in starts else None
        held_now = max(r.last_seen for r in rows)
        idle_now = idle_since is not None and held_now - idle_since >= window
        if not idle_now and (mean is None or mean >= below_percent):
            continue
        out.append(
            IdleClaim(
                cluster=cluster,
                namespace=namespace,
                claim=claim,
                model=rows[0].model,
                profile=rows[0].profile,
                nodes=sorted({r.node for r in rows if r.node}),
                devices=len(rows),
                gpus=round(sum(r.gpu_fraction for r in rows), 3),
                idle_since=idle_since,
                idle_gpu_hours=round(sum(r.idle_seconds * r.gpu_fraction for r in rows) / 3600.0, 3),
                observed_hours=round(max(r.observed_seconds for r in rows) / 3600.0, 3),
                mean_active_percent=None if mean is None else round(mean, 2),
                gap_samples=sum(r.gap_samples for r in rows),
                first_seen=min(r.first_seen for r in rows),
                last_seen=held_now,
                device_names=[f"{r.pool}/{r.device}" for r in rows],
            )
        )
    out.sort(key=lambda c: (-c.idle_gpu_hours, -c.gpus, c.namespace, c.claim))
    return out


def add_blocked(
    claims: list[IdleClaim], window: timedelta, allows: Callable[[str, str], bool] | None = None
) -> None:
    """Count, for each idle claim, the claims that waited for its model while it sat idle: pending for
    lack of capacity (their diagnosis found devices of that model, fewer free than needed) between its
    idle start (or first sample) and its last sample. Waiting claims the viewer may not see are counted,
    not named.

    A cause's ``last_seen`` is its claim's last *diagnosis*, not the end of its wait: diagnoses run when
    the fleet changes, and a fleet whose GPUs sit idle may not change for hours. A claim that is still
    pending therefore waits until now under the cause it was last given (its latest row)."""
    if not claims:
        return
    from claims.models import PendingCause as cause
    from fleet.models import ResourceClaim

    since = min(c.idle_since or c.first_seen for c in claims)
    until = max(c.last_seen for c in claims)
    pending_now = ResourceClaim.objects.filter(
        cluster_id=OuterRef("cluster_id"), uid=OuterRef("uid"), state="pending"
    )
    rows = (
        cause.objects.filter(category="capacity", first_seen__lte=until)
        .annotate(pending_now=Exists(pending_now))
        .filter(Q(last_seen__gte=since) | Q(pending_now=True))
    )
    latest: dict[tuple[str, str], datetime] = {}  # a still-pending claim's current cause: its latest row
    found: list[tuple[str, str, str, str, datetime, datetime, bool, set[str]]] = []
    for cluster, uid, namespace, name, first, last, still, result in rows.values_list(
        "cluster__name", "uid", "namespace", "name", "first_seen", "last_seen", "pending_now", "result"
    ):
        found.append((cluster, uid, namespace, name, first, last, still, waited_for(result or {})))
        if still:
            latest[(cluster, uid)] = max(latest.get((cluster, uid), last), last)
    waiting: list[tuple[str, str, str, datetime, datetime | None, set[str]]] = [
        # None: waiting still, up to now
        (cluster, namespace, name, first, None if still and latest[(cluster, uid)] == last else last, models)
        for cluster, uid, namespace, name, first, last, still, models in found
    ]
    for c in claims:
        start = c.idle_since or c.first_seen
        names = sorted(
            {
                (ns, name)
                for cluster, ns, name, first, last, models in waiting
                if cluster == c.cluster
                and c.model in models
                and first <= c.last_seen
                and (last is None or last >= start)
            }
        )
        c.blocked = len(names)
        c.blocked_examples = [f"{ns}/{n}" for ns, n in names if allows is None or allows(c.cluster, ns)][:5]


def waited_for(result: dict[str, Any]) -> set[str]:
    """The models a diagnosed claim waited for: devices of the model match a request, but fewer are free
    than it needs (all the matching ones, for an ``All`` request)."""
    models = set()
    for r in result.get("requests", []):
        count = r.get("count")
        for g in r.get("groups", []):
            matching = int(g.get("matching") or 0)
            need = matching if count == "All" else int(count or 1)
            if matching and int(g.get("free") or 0) < need:
                models.add(str(g.get("model", "")))
    return models


def waste(claims: Iterable[IdleClaim]) -> list[Waste]:
    """Idle GPU-hours per (namespace, model), largest first."""
    groups: dict[tuple[str, str], list[IdleClaim]] = defaultdict(list)
    for c in claims:
        groups[(c.namespace, c.model)].append(c)
    rows = [
        Waste(ns, model, len(cs), round(sum(c.idle_gpu_hours for c in cs), 3))
        for (ns, model), cs in groups.items()
    ]
    return sorted(rows, key=lambda w: (-w.idle_gpu_hours, w.namespace, w.model))


def device_usage(cluster_ids: Iterable[int] | None = None) -> dict[tuple[int, str, str, str], DeviceUsage]:
    """The latest sample of every device, by (cluster id, driver, pool, device)."""
    rows = DeviceUsage.objects.all()
    if cluster_ids is not None:
        rows = rows.filter(cluster_id__in=list(cluster_ids))
    return {(r.cluster_id, r.driver, r.pool, r.device): r for r in rows}


def sampling_states(cluster_ids: Iterable[int] | None = None) -> list[SamplingState]:
    rows = SamplingState.objects.select_related("cluster").order_by("cluster__name")
    if cluster_ids is not None:
        rows = rows.filter(cluster_id__in=list(cluster_ids))
    return list(rows)


def unavailable_since(cluster_ids: Iterable[int] | None = None) -> datetime | None:
    """The earliest "utilization unavailable since" among the clusters, None when all answer."""
    times = [s.unavailable_since for s in sampling_states(cluster_ids) if s.unavailable_since]
    return min(times) if times else None


def trends(
    since: datetime, until: datetime, clusters: Iterable[int] | None = None, resolution: str = ""
) -> QuerySet[UsageTrend]:
    """Trend points in the window: minute points for up to 7 days back, hourly ones beyond."""
    chosen = resolution or ("minute" if until - since <= timedelta(days=7) else "hour")
    rows = UsageTrend.objects.filter(resolution=chosen, time__gte=since, time__lte=until)
    if clusters is not None:
        rows = rows.filter(cluster_id__in=list(clusters))
    return rows.select_related("cluster").order_by("time", "cluster__name", "model", "namespace")
