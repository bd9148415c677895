"""Allocation history: a sample of every (cluster, model, MIG profile) a minute, downsampled with age.

``sample_allocation`` (beat, every minute) stores one ``AllocationSample`` per group at the current minute;
``downsample_history`` (beat, hourly) folds minute points older than 30 days into hourly averages and drops
hourly points older than a year. Both are idempotent: a point is keyed by its group, resolution and time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from celery import shared_task
from django.db import transaction
from django.db.models import Avg
from django.db.models.functions import TruncHour
from django.utils import timezone

from fleet import selectors
from fleet.models import AllocationSample, Cluster

MINUTE_RETENTION = timedelta(days=30)
HOUR_RETENTION = timedelta(days=365)
_KEY = ["cluster", "model", "profile", "resolution", "time"]


def samples_for(cluster: Cluster, at: datetime) -> list[AllocationSample]:
    """The points of one cluster at ``at``: per model its GPUs in compute slices (partition-aware), per
    MIG profile its devices."""
    summary = selectors.fleet_summary(cluster.pk)
    points = [
        AllocationSample(
            time=at,
            cluster=cluster,
            model=m.model,
            profile="",
            total=m.compute_slices,
            allocated=m.compute_slices_allocated,
        )
        for m in summary.models
    ]
    for g in summary.groups:
        if g.kind == "mig" and g.profile:
            points.append(
                AllocationSample(
                    time=at,
                    cluster=cluster,
                    model=g.model,
                    profile=g.profile,
                    total=g.total,
                    allocated=g.allocated,
                )
            )
    return points


@shared_task(ignore_result=True)
def sample_allocation(now: str | None = None) -> int:
    """Store this minute's points for every cluster (re-running within the minute overwrites them)."""
    at = (datetime.fromisoformat(now) if now else timezone.now()).replace(second=0, microsecond=0)
    points = [p for cluster in Cluster.objects.all() for p in samples_for(cluster, at)]
    AllocationSample.objects.bulk_create(
        points, update_conflicts=True, unique_fields=_KEY, update_fields=["total", "allocated"]
    )
    return len(points)


@shared_task(ignore_result=True)
def downsample_history(now: str | None = None) -> int:
    """Fold minute points older than 30 days into hourly averages; drop hourly points older than a year.

    Only whole hours are folded, so a later run never averages an hour from a partial set of minutes."""
    at = datetime.fromisoformat(now) if now else timezone.now()
    cutoff = (at - MINUTE_RETENTION).replace(minute=0, second=0, microsecond=0)
    old = AllocationSample.objects.filter(resolution="minute", time__lt=cutoff)
    with transaction.atomic():
        hours = (
            old.annotate(hour=TruncHour("time"))
            .values("cluster_id", "model", "profile", "hour")
            .annotate(total=Avg("total"), allocated=Avg("allocated"))
        )
        points = [
            AllocationSample(
                time=h["hour"],
                cluster_id=h["cluster_id"],
                model=h["model"],
                profile=h["profile"],
                resolution="hour",
                total=h["total"],
                allocated=h["allocated"],
            )
            for h in hours
        ]
        AllocationSample.objects.bulk_create(
            points, update_conflicts=True, unique_fields=_KEY, update_fields=["total", "allocated"]
        )
        old.delete()
        AllocationSample.objects.filter(resolution="hour", time__lt=at - HOUR_RETENTION).delete()
    return len(points)
