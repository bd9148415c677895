"""Allocation against utilization over time, per model and/or namespace: the trends page and API.

Points come from ``UsageTrend`` (written each round): per minute for the last 7 days, hourly beyond. A
point's ``utilization_percent`` is active / measured GPUs (gaps excluded), null when nothing was measured.
Rounds that did not happen (Prometheus down, no worker) leave no point: two points of a group further apart
than ``window.gap_seconds`` have a gap between them, which the chart draws as a gap.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from fleet.models import Cluster
from usage import selectors
from usage.report import WindowError, window

GROUPS = {"model": ("model",), "namespace": ("namespace",), "model,namespace": ("model", "namespace")}
MAX_POINTS = 50_000


def trend_rows(
    since: str | None = None,
    until: str | None = None,
    cluster: str | None = None,
    group: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Summed points per (time, cluster, group) in the window (default the last 24 hours)."""
    now = now or timezone.now()
    start, end = window(since, until, now)
    chosen = group or "model"
    if chosen not in GROUPS:
        raise WindowError("group", f"one of {', '.join(GROUPS)}")
    fields = GROUPS[chosen]
    rows = selectors.trends(start, end)
    if cluster:
        rows = rows.filter(cluster__name=cluster)
    resolution = "minute" if end - start <= timedelta(days=7) else "hour"
    # A point a round (minute points: the round's minute), an hour's average: more than two steps apart
    # means rounds were missed.
    step = max(settings.CLAIMSCOPE_USAGE_INTERVAL, 60) if resolution == "minute" else 3600
    cluster_ids = None
    if cluster:
        cluster_ids = list(Cluster.objects.filter(name=cluster).values_list("pk", flat=True))
    summed = (
        rows.values("time", "cluster__name", *fields)
        .annotate(
            allocated=Sum("allocated"), measured=Sum("measured"), active=Sum("active"), idle=Sum("idle")
        )
        .order_by("time", "cluster__name", *fields)
    )
    points = []
    for r in summed[: MAX_POINTS + 1]:
        point = {"time": r["time"], "cluster": r["cluster__name"], **{f: r[f] for f in fields}}
        point |= {k: round(r[k], 3) for k in ("allocated", "measured", "active", "idle")}
        point["utilization_percent"] = round(100 * r["active"] / r["measured"], 1) if r["measured"] else None
        points.append(point)
    truncated = len(points) > MAX_POINTS
    return {
        "window": {
            "since": start,
            "until": end,
            "cluster": cluster or None,
            "group": chosen,
            "resolution": resolution,
            "gap_seconds": 2 * step,
        },
        "unavailable_since": selectors.unavailable_since(cluster_ids),
        "truncated": truncated,
        "points": points[:MAX_POINTS],
    }
