"""Debounced recomputation of pending-claim diagnoses.

``request_recompute(cluster, kind)`` is called on every relevant fleet change (slices, classes, claims,
pods, nodes). The first call within ``DEBOUNCE_SECONDS`` enqueues ``recompute_diagnoses`` with that
countdown; later calls in the window are absorbed (a Redis ``SET NX EX`` marker, or an in-process one when
Redis is not configured). The task diagnoses every pending claim of the cluster on one fleet snapshot and
stores each result with its time; stale rows of claims that are no longer pending are removed. It takes
a cluster name and is idempotent.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from claims.diagnosis import diagnose, prepare
from claims.fleetstate import FleetState
from claims.models import ClaimDiagnosis, ResourceClaim

log = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 5
RELEVANT_KINDS = frozenset({"ResourceSlice", "DeviceClass", "ResourceClaim", "Pod", "Node"})
_local_marks: dict[str, float] = {}


def _marker(cluster: str) -> str:
    return f"claimscope:diagnoses:pending:{cluster}"


def _claim_window(cluster: str) -> bool:
    """True if this call opens a new debounce window (and so must enqueue the task)."""
    url = getattr(settings, "REDIS_URL", None)
    if url:
        import redis

        try:
            client = redis.Redis.from_url(url)
            return bool(client.set(_marker(cluster), "1", nx=True, ex=DEBOUNCE_SECONDS))
        except redis.RedisError:
            log.warning("redis unavailable; diagnoses of %s recomputed without debounce", cluster)
            return True
    now = time.monotonic()
    if now - _local_marks.get(cluster, -DEBOUNCE_SECONDS) < DEBOUNCE_SECONDS:
        return False
    _local_marks[cluster] = now
    return True


def request_recompute(cluster: str, kind: str = "") -> bool:
    """Ask for the diagnoses of ``cluster`` to be recomputed soon; returns True if a task was enqueued."""
    if kind and kind not in RELEVANT_KINDS:
        return False
    if not _claim_window(cluster):
        return False
    transaction.on_commit(lambda: recompute_diagnoses.apply_async(args=[cluster], countdown=DEBOUNCE_SECONDS))
    return True


def on_fleet_change(event: dict[str, Any]) -> bool:
    """Hook for ingest's ``fleet.change`` events (``{"cluster", "kind", ...}``)."""
    return request_recompute(str(event.get("cluster", "")), str(event.get("kind", "")))


def store_diagnosis(state: FleetState, claim: ResourceClaim) -> ClaimDiagnosis:
    """Diagnose one claim on ``state`` and store the result with the current time."""
    raw = {**claim.raw, "kind": "ResourceClaim"}
    result = diagnose(state, raw).as_dict()
    stored, _ = ClaimDiagnosis.objects.update_or_create(
        claim=claim,
        defaults={
            "category": result["category"],
            "summary": result["summary"],
            "result": result,
            "computed_at": timezone.now(),
        },
    )
    return stored


@shared_task(ignore_result=True)
def recompute_diagnoses(cluster: str) -> dict[str, int]:
    """Diagnose every pending claim of ``cluster``; returns counts per category."""
    try:
        state = FleetState.from_db(cluster)
    except LookupError:
        log.warning("recompute_diagnoses: unknown cluster %s", cluster)
        return {}
    pending = list(ResourceClaim.objects.filter(cluster__name=cluster, state="pending").order_by("id"))
    if pending:
        prepare(state)
    counts: dict[str, int] = {}
    for claim in pending:
        stored = store_diagnosis(state, claim)
        counts[stored.category] = counts.get(stored.category, 0) + 1
    ClaimDiagnosis.objects.filter(claim__cluster__name=cluster).exclude(claim__state="pending").delete()
    return counts
