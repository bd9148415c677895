"""Celery tasks that keep every (cluster, kind) stream running, on the "watch" queue.

``watch_stream`` runs one round (resume or list, watch until the server's timeout, batches through ingest
with the cursor in the same transaction) under the stream's Redis lock, then re-enqueues itself with the
lock handed to the new message. ``restart_lapsed_streams`` (beat, every 30 s) starts a stream whose lock
has lapsed: a worker died, a message was lost, or Redis lost its keys. Both are idempotent; duplicates exit
at the lock, and ingest's resourceVersion fence makes an overlapping writer harmless.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import shared_task
from celery.signals import worker_shutting_down
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from fleet import clusters
from fleet.kube import streams
from fleet.kube.lock import StreamLock
from fleet.models import WatchCursor

log = logging.getLogger(__name__)

# Stop events of the rounds running in this worker: a shutdown ends their watches promptly, and each
# hands its stream over to the queue for another worker. ``_shutting_down`` also covers a message that a
# thread picks up after the shutdown began: it goes back to the queue without a round.
_running: set[threading.Event] = set()
_running_lock = threading.Lock()
_shutting_down = threading.Event()


def stop_rounds() -> None:
    """End every round of this worker now; rounds that start later hand their message back at once.

    Called from the SIGTERM handler and from the worker's shutdown bootstep (dashboard/celery.py), so every
    way a worker stops (warm, cold, an unrecoverable error) ends the rounds within about a second."""
    _shutting_down.set()
    with _running_lock:
        for stop in _running:
            stop.set()


@worker_shutting_down.connect
def _stop_rounds(**_: Any) -> None:
    stop_rounds()


@shared_task(queue="watch", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def watch_stream(cluster: str, kind: str, token: str = "", failures: int = 0) -> str:
    """One watch round of a stream, then re-enqueue; returns what happened (for logs and tests)."""
    if kind not in streams.STREAM_KINDS:
        log.error("watch_stream: unknown kind %r", kind)
        return "unknown-kind"
    stop = threading.Event()
    with _running_lock:
        shutting_down = _shutting_down.is_set()
        if not shutting_down:
            _running.add(stop)
    if shutting_down:
        return _hand_back(cluster, kind, token, failures)
    try:
        result, successor = streams.locked_round(streams.redis_client(), cluster, kind, stop, token, failures)
    finally:
        with _running_lock:
            _running.discard(stop)
    if result is None:
        return "busy"
    if successor is None:
        return "lost"
    if result.outcome == "unconfigured":
        streams.release(successor, cluster, kind)
        return result.outcome
    if watch_stream.app.conf.task_always_eager:
        # Without a broker there is no queue to come back through; `manage.py watch` is the loop then.
        return result.outcome
    watch_stream.apply_async((cluster, kind, successor, result.failures), countdown=result.delay)
    return result.outcome


def _vouched_streams() -> set[tuple[str, str]]:
    """(cluster, kind) of the streams whose lease has not lapsed; none when the database is unreachable
    (then the locks alone decide)."""
    try:
        return set(
            WatchCursor.objects.filter(lease_until__gt=timezone.now()).values_list("cluster__name", "kind")
        )
    except DatabaseError as exc:
        log.warning("restart_lapsed_streams: database unavailable (%s); going by the locks", exc)
        close_old_connections()
        return set()


def _hand_back(cluster: str, kind: str, token: str, failures: int) -> str:
    """Re-enqueue a message picked up during shutdown, unchanged: its token (if any) still holds the lock."""
    try:
        watch_stream.apply_async((cluster, kind, token, failures))
    except Exception as exc:  # the broker is gone too: the lock lapses and the beat restarts the stream
        log.warning("%s/%s: cannot hand the stream back during shutdown: %s", cluster, kind, exc)
        return "dropped"
    return "handed-back"


@shared_task(queue="watch", ignore_result=True)
def restart_lapsed_streams() -> list[str]:
    """Enqueue a round for every configured stream nobody holds; returns the streams started."""
    client = streams.redis_client()
    started: list[str] = []
    vouched = _vouched_streams()
    for config in clusters.configured():
        for kind in streams.STREAM_KINDS:
            if (config.name, kind) in vouched:
                # Its worker renewed the lease (fleet.kube.streams): alive, even if Redis lost the lock.
                # After a Redis restart the heartbeats re-create the locks; starting a second round here
                # would only make the first one stop and resume (two relists' worth of churn).
                continue
            lock = StreamLock(client, config.name, kind, streams.lock_ttl())
            try:
                if lock.held_by_anyone():
                    continue
            except redis.RedisError as exc:
                log.warning("restart_lapsed_streams: Redis unavailable: %s", exc)
                return started
            watch_stream.delay(config.name, kind)
            started.append(f"{config.name}/{kind}")
    if started:
        log.info("restarted %d lapsed stream(s): %s", len(started), ", ".join(started))
    return started
