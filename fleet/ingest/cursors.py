"""The watch cursors (``WatchCursor``): where each (cluster, kind) stream stands, its state and its lease.
The one writer of that table: batches and relists save the position in their transaction
(:func:`save_cursor`), the reflector its state changes (:func:`save_state`), the streams' heartbeat their
leases (:func:`record_leases`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import models
from django.db.models import DateTimeField, F, Q, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from fleet.ingest.specs import CursorUpdate
from fleet.models import Cluster, WatchCursor


def save_cursor(
    cluster: Cluster, kind: str, cursor: CursorUpdate, forward_only: bool = False, relisted: bool = False
) -> None:
    """Save the stream's position. ``forward_only`` (watch batches): never move the cursor back. Two
    writers overlap when a worker was frozen or cut off longer than the lock's TTL and another took the
    stream over; the late one's batch must not make the next round resume from an older version (the
    rows have their own fence). A relist sets the position as listed: after a 410 the history may be new.
    ``relisted``: the list replaced a position the stream had, counted in ``relists`` (``/metrics``)."""
    rv = Decimal(cursor.resource_version)
    defaults: dict[str, Any] = {"state": cursor.state, "last_event_at": timezone.now()}
    if cursor.objects is not None:
        defaults["object_count"] = cursor.objects
    if relisted:
        defaults["relists"] = F("relists") + 1
    position = Greatest(F("resource_version"), Value(rv, output_field=models.DecimalField()))
    WatchCursor.objects.update_or_create(
        cluster=cluster,
        kind=kind,
        defaults={**defaults, "resource_version": position if forward_only else rv},
        create_defaults={**defaults, "resource_version": rv, "relists": 1 if relisted else 0},
    )


def save_state(cluster: Cluster, kind: str, state: str, error: str, lease: float) -> None:
    """Record a stream's state (and its error, if any). Writing a state is a sign of life as good as a
    heartbeat: the lease moves with it, to now + ``lease`` seconds."""
    values: dict[str, Any] = {"state": state}
    if error:
        values.update(last_error=error[:4000], last_error_at=timezone.now())
    WatchCursor.objects.update_or_create(
        cluster=cluster,
        kind=kind,
        defaults={**values, "lease_until": lease_end(lease)},
        create_defaults={**values, "lease_until": timezone.now() + timedelta(seconds=lease)},
    )


def listing(cluster: Cluster, kinds: Sequence[str]) -> bool:
    """Whether a stream of one of these kinds of the cluster is in a list: its state says so and its
    lease is live (a worker that died mid-list vouches for nothing)."""
    return WatchCursor.objects.filter(
        cluster=cluster, kind__in=kinds, state="listing", lease_until__gt=timezone.now()
    ).exists()


def lease_end(seconds: float) -> Any:
    """``lease_until`` set to now + ``seconds``, never earlier than it already is (a round's end promises
    the next round's start; a heartbeat racing with it must not take that back)."""
    until = Value(timezone.now() + timedelta(seconds=seconds), output_field=DateTimeField())
    return Greatest(Coalesce(F("lease_until"), until), until)


def record_leases(stream_keys: Sequence[tuple[int, str]], seconds: float) -> None:
    """Extend the leases of these (cluster id, kind) streams to now + ``seconds``, in one statement."""
    if not stream_keys:
        return
    match = Q()
    for cluster_id, kind in stream_keys:
        match |= Q(cluster_id=cluster_id, kind=kind)
    WatchCursor.objects.filter(match).update(lease_until=lease_end(seconds))
