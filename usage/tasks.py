"""Celery tasks of the utilization sampling (beat: ``usage-sample`` every CLAIMSCOPE_USAGE_INTERVAL)."""

from __future__ import annotations

from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import Avg
from django.db.models.functions import TruncHour
from django.utils import timezone

from fleet.models import Cluster
from usage import ingest
from usage.models import ClaimUsage, UsageTrend
from usage.prometheus import PrometheusSource
from usage.sampler import sample_cluster

MINUTE_RETENTION = timedelta(days=7)
HOUR_RETENTION = timedelta(days=365)
_KEY = ["cluster", "model", "namespace", "resolution", "time"]


def thresholds() -> ingest.Thresholds:
    return ingest.Thresholds(
        below=settings.CLAIMSCOPE_IDLE_BELOW_PERCENT / 100.0,
        window=timedelta(minutes=settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES),
        interval=timedelta(seconds=settings.CLAIMSCOPE_USAGE_INTERVAL),
    )


@shared_task(ignore_result=True)
def sample_utilization(now: str | None = None) -> dict[str, bool]:
    """One round for every cluster with a Prometheus configured; {cluster: round ok}."""
    at = datetime.fromisoformat(now) if now else timezone.now()
    out: dict[str, bool] = {}
    for name, config in sorted(settings.CLAIMSCOPE_PROMETHEUS.items()):
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            continue  # not mirrored (yet): nothing to join the samples to
        out[name] = sample_cluster(cluster, PrometheusSource(config), at, thresholds()).ok
    return out


@shared_task(ignore_result=True)
def downsample_trends(now: str | None = None) -> int:
    """Fold minute trend points older than 7 days into hourly averages; drop hourly points and holdings
    older than a year. Only whole hours are folded."""
    at = datetime.fromisoformat(now) if now else timezone.now()
    cutoff = (at - MINUTE_RETENTION).replace(minute=0, second=0, microsecond=0)
    old = UsageTrend.objects.filter(resolution="minute", time__lt=cutoff)
    with transaction.atomic():
        hours = (
            old.annotate(hour=TruncHour("time"))
            .values("cluster_id", "model", "namespace", "hour")
            .annotate(
                allocated=Avg("allocated"), measured=Avg("measured"), active=Avg("active"), idle=Avg("idle")
            )
        )
        points = [
            UsageTrend(
                time=h["hour"],
                cluster_id=h["cluster_id"],
                model=h["model"],
                namespace=h["namespace"],
                resolution="hour",
                allocated=h["allocated"],
                measured=h["measured"],
                active=h["active"],
                idle=h["idle"],
            )
            for h in hours
        ]
        UsageTrend.objects.bulk_create(
            points,
            update_conflicts=True,
            unique_fields=_KEY,
            update_fields=["allocated", "measured", "active", "idle"],
        )
        old.delete()
        UsageTrend.objects.filter(resolution="hour", time__lt=at - HOUR_RETENTION).delete()
        ClaimUsage.objects.filter(last_seen__lt=at - HOUR_RETENTION).delete()
    return len(points)
