"""Read queries of the usage tables: idle allocations, device values for pages, trends, sampling state."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, QuerySet, Sum

from fleet.models import Cluster
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
    share is its fraction of a GPU (a 1g MIG slice is 1/7). Gaps count as neither idle nor busy.

    Two queries: the database sums the holdings per claim (a week holds tens of thousands of holdings
    on a large fleet; reading them row by row was seconds), then the devices of the claims listed."""
    per_claim = (
        holdings(since, until, clusters, visible)
        .order_by()
        .values("cluster_id", "namespace", "claim")
        .annotate(
            n=Count("id"),
            samples_=Sum("samples"),
            active_=Sum("active_sum"),
            idle_known=Count("idle_since"),  # holdings with an idle stretch under way
            idle_since_=Max("idle_since"),
            last_seen_=Max("last_seen"),
            first_seen_=Min("first_seen"),
            gpus_=Sum("gpu_fraction"),
            idle_weighted=Sum(F("idle_seconds") * F("gpu_fraction")),
            observed=Max("observed_seconds"),
            gaps=Sum("gap_samples"),
        )
    )
    names = dict(Cluster.objects.values_list("pk", "name"))
    found: dict[tuple[int, str, str], IdleClaim] = {}
    for row in per_claim:
        samples = row["samples_"] or 0
        mean = (row["active_"] / samples * 100.0) if samples else None
        # A claim's devices are idle together while every one has a stretch under way: since the latest.
        idle_since = row["idle_since_"] if row["idle_known"] == row["n"] else None
        held_now = row["last_seen_"]
        idle_now = idle_since is not None and held_now - idle_since >= window
        if not idle_now and (mean is None or mean >= below_percent):
            continue
        key = (row["cluster_id"], row["namespace"], row["claim"])
        found[key] = IdleClaim(
            cluster=names.get(row["cluster_id"], ""),
            namespace=row["namespace"],
            claim=row["claim"],
            model="",
            profile="",
            nodes=[],
            devices=row["n"],
            gpus=round(row["gpus_"], 3),
            idle_since=idle_since,
            idle_gpu_hours=round((row["idle_weighted"] or 0.0) / 3600.0, 3),
            observed_hours=round((row["observed"] or 0.0) / 3600.0, 3),
            mean_active_percent=None if mean is None else round(mean, 2),
            gap_samples=row["gaps"] or 0,
            first_seen=row["first_seen_"],
            last_seen=held_now,
        )
    _add_devices(found, since, until, clusters, visible)
    out = list(found.values())
    out.sort(key=lambda c: (-c.idle_gpu_hours, -c.gpus, c.namespace, c.claim))
    return out


CLAIM_CHUNK = 500  # claim names per IN list: far under SQLite's bound-parameter limit


def _add_devices(
    found: dict[tuple[int, str, str], IdleClaim],
    since: datetime,
    until: datetime,
    clusters: Iterable[int] | None,
    visible: Q | None,
) -> None:
    """Model, profile (of the first device by name), nodes and device names of the claims found."""
    names = sorted({claim for _, _, claim in found})
    nodes: dict[tuple[int, str, str], set[str]] = defaultdict(set)
    for start in range(0, len(names), CLAIM_CHUNK):
        rows = holdings(since, until, clusters, visible).filter(claim__in=names[start : start + CLAIM_CHUNK])
        for cluster_id, namespace, claim, model, profile, node, pool, device in rows.order_by(
            "device"
        ).values_list("cluster_id", "namespace", "claim", "model", "profile", "node", "pool", "device"):
            c = found.get((cluster_id, namespace, claim))
            if c is None:
                continue  # a claim of the same name elsewhere
            if not c.device_names:
                c.model, c.profile = model, profile
            c.device_names.append(f"{pool}/{device}")
            if node:
                nodes[(cluster_id, namespace, claim)].add(node)
    for key, c in found.items():
        c.nodes = sorted(nodes.get(key, ()))


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
