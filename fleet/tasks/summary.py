"""Keeps the API's fleet summary warm: computed by a Celery task after fleet changes, never on a request.

Ingest's change listener calls :func:`on_fleet_change` after each committed batch of slices or claims.
The first call for a new fleet version enqueues :func:`warm_summary` after ``DEBOUNCE_SECONDS`` (a burst
of batches is one computation: later calls find the version's marker in the cache). The task computes
the summary of the fleet as it is when it runs, and is idempotent (a cached version is not recomputed).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import shared_task
from django.core.cache import cache

from fleet.api import selectors as api_selectors

log = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 2  # the summary of the L fleet takes about 2 s: a refresh at most every few seconds
RELEVANT_KINDS = frozenset({"ResourceSlice", "ResourceClaim", "DeviceTaintRule"})  # what the summary counts
_PENDING = "api:summary:pending"  # one refresh in flight at a time (a marker in the shared cache)


def on_fleet_change(event: dict[str, Any]) -> bool:
    """Ingest's change listener (reads only ``event["kind"]``); True when a refresh was enqueued."""
    if event.get("kind") not in RELEVANT_KINDS:
        return False
    return _enqueue()


def request_warm(key: str) -> float:
    """Make sure a refresh for the summary cached under ``key`` is on its way; returns when it was first
    asked for (so a request can tell a refresh under way from an overdue one)."""
    asked = cache.get(f"{_PENDING}:{key}")
    if asked is None:
        asked = time.time()
        cache.set(f"{_PENDING}:{key}", asked, timeout=api_selectors.SUMMARY_CACHE_SECONDS)
        _enqueue()
    return float(asked)


def _enqueue() -> bool:
    # cache.add is atomic on Redis (SET NX): only the first caller within the window enqueues.
    if not cache.add(_PENDING, 1, timeout=DEBOUNCE_SECONDS):
        return False
    warm_summary.apply_async(countdown=DEBOUNCE_SECONDS)
    return True


@shared_task(ignore_result=True)
def warm_summary() -> str:
    """Compute and cache the summary of the current fleet version (nothing when it is cached already)."""
    started = time.perf_counter()
    api_selectors.warm_summary_cache()
    return f"summary warm in {time.perf_counter() - started:.1f} s"
