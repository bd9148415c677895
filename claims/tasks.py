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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from claims import history
from claims.causes import Pending, cause_of
from claims.consumers import notify_pending_changed
from claims.diagnosis import diagnose, prepare
from claims.fleetstate import FleetState
from claims.models import ClaimDiagnosis, PendingCause
from fleet.models import ResourceClaim

log = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 5
RELEVANT_KINDS = frozenset(
    {"ResourceSlice", "DeviceClass", "ResourceClaim", "Pod", "Node", "DeviceTaintRule"}
)
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
    """Hook for ingest's ``fleet.change`` events (``{"cluster", "kind", ...}``). A finished import
    (``"imported"``) recomputes at once: its first batch may have opened a window whose task (run at once
    where tasks run in-process) saw none of the later batches."""
    cluster = str(event.get("cluster", ""))
    if event.get("imported"):
        transaction.on_commit(lambda: recompute_diagnoses.apply_async(args=[cluster]))
        return True
    return request_recompute(cluster, str(event.get("kind", "")))


def store_diagnosis(state: FleetState, claim: ResourceClaim, now: datetime | None = None) -> ClaimDiagnosis:
    """Diagnose one claim on ``state`` and store the result with its time (default: now)."""
    raw = {**claim.raw, "kind": "ResourceClaim"}
    result = diagnose(state, raw).as_dict()
    stored, _ = ClaimDiagnosis.objects.update_or_create(
        claim=claim,
        defaults={
            "category": result["category"],
            "summary": result["summary"],
            "result": result,
            "computed_at": now or timezone.now(),
        },
    )
    return stored


def record_causes(cluster: str, diagnosed: list[ClaimDiagnosis], now: datetime) -> None:
    """Keep each pending claim's cause (one row per claim and cause group, first and last seen), so the
    triage can report the causes of claims no longer pending. One bulk statement."""
    rows = []
    for d in diagnosed:
        claim = d.claim
        since = claim.created_at or now
        key = cause_of(Pending(cluster, claim.namespace, claim.name, since, d.result)).key
        rows.append(
            PendingCause(
                cluster_id=claim.cluster_id,
                uid=claim.uid,
                namespace=claim.namespace,
                name=claim.name,
                category=d.category,
                group_key=key,
                summary=d.summary,
                result=d.result,
                first_seen=now,
                last_seen=now,
            )
        )
    PendingCause.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["cluster", "uid", "category", "group_key"],
        update_fields=["summary", "result", "last_seen"],  # first_seen stays that of the first diagnosis
    )


RUN_TTL = 3600  # seconds: a recompute holding its cluster's lock longer than this is presumed dead
# Delete the key only if it still holds our token (another run may own it after our TTL ran out).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


@contextmanager
def _single_flight(cluster: str) -> Iterator[bool]:
    """One recompute per cluster at a time (on a large fleet one takes minutes, and changes keep coming).

    Yields True when this run holds the cluster's lock; False when another run holds it: then a rerun is
    flagged, and the running one enqueues one more recompute when it ends, so no change goes unseen.
    Without Redis (the demo, tasks run in-process) every run proceeds."""
    url = getattr(settings, "REDIS_URL", None)
    if not url:
        yield True
        return
    import redis

    client = redis.Redis.from_url(url)
    key, rerun, token = (
        f"claimscope:diagnoses:running:{cluster}",
        f"claimscope:diagnoses:rerun:{cluster}",
        uuid4().hex,
    )
    try:
        acquired = bool(client.set(key, token, nx=True, ex=RUN_TTL))
        if not acquired:
            client.set(rerun, "1", ex=RUN_TTL)
    except redis.RedisError:
        log.warning("redis unavailable; diagnoses of %s recomputed without the single-run lock", cluster)
        yield True
        return
    if not acquired:
        log.info("recompute_diagnoses: %s is being recomputed; one more run will follow it", cluster)
        yield False
        return
    try:
        yield True
    finally:
        try:
            client.eval(_RELEASE, 1, key, token)
            if client.delete(rerun):
                recompute_diagnoses.apply_async(args=[cluster], countdown=DEBOUNCE_SECONDS)
        except redis.RedisError:
            log.warning("redis unavailable; the lock of %s expires by itself", cluster)


@shared_task(bind=True, ignore_result=True)
def recompute_diagnoses(self: Any, cluster: str, now: str | None = None) -> dict[str, int]:
    """Diagnose every pending claim of ``cluster``; returns counts per category. ``now`` (ISO 8601, default
    the current time) stamps the results: a replay of a simulated weekend passes its simulated time.
    As a Celery task it runs once per cluster at a time (:func:`_single_flight`); called as a function
    (tests, replays) it just runs."""
    if self.request.called_directly:
        return _recompute(cluster, now)
    with _single_flight(cluster) as mine:
        return _recompute(cluster, now) if mine else {}


def _recompute(cluster: str, now: str | None) -> dict[str, int]:
    at = datetime.fromisoformat(now) if now else timezone.now()
    try:
        # Lean: each claim is diagnosed from its own row (store_diagnosis), never looked up in the state.
        state = FleetState.from_db(cluster, lean=True)
    except LookupError:
        log.warning("recompute_diagnoses: unknown cluster %s", cluster)
        return {}
    with state:  # released now, not at the cyclic collector's next full run (FleetState.release)
        return _diagnose_pending(cluster, state, at)


def _diagnose_pending(cluster: str, state: FleetState, at: datetime) -> dict[str, int]:
    pending = list(ResourceClaim.objects.filter(cluster__name=cluster, state="pending").order_by("id"))
    if pending:
        prepare(state)
    counts: dict[str, int] = {}
    diagnosed = []
    # One transaction: a page never shows half old, half new diagnoses of one fleet state.
    with transaction.atomic():
        for claim in pending:
            stored = store_diagnosis(state, claim, at)
            diagnosed.append(stored)
            counts[stored.category] = counts.get(stored.category, 0) + 1
        record_causes(cluster, diagnosed, at)
        ClaimDiagnosis.objects.filter(claim__cluster__name=cluster).exclude(claim__state="pending").delete()
        # Open pending pages refetch their rows (claims.consumers); after commit, like every side effect.
        transaction.on_commit(lambda: notify_pending_changed(cluster))
    return counts


@shared_task(ignore_result=True)
def prune_claim_history(now: str | None = None) -> dict[str, int]:
    """Daily: drop claim history and kept pending causes older than ``CLAIMSCOPE_CLAIM_HISTORY_DAYS``."""
    at = datetime.fromisoformat(now) if now else timezone.now()
    before = at - timedelta(days=settings.CLAIMSCOPE_CLAIM_HISTORY_DAYS)
    changes, lives = history.prune(before)
    causes, _ = PendingCause.objects.filter(last_seen__lt=before).delete()
    return {"changes": changes, "lifecycles": lives, "causes": causes}
