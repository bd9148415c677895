"""Running streams: one round of one (cluster, kind), shared by the Celery task and ``manage.py watch``.

Settings (all optional, see docs/watchers.md): ``CLAIMSCOPE_WATCH_TIMEOUT`` (server-side watch timeout;
default a random 5-10 minutes per watch, so that reconnects of many streams spread out),
``CLAIMSCOPE_WATCH_LOCK_TTL``, ``CLAIMSCOPE_WATCH_FORBIDDEN_RETRY``, ``CLAIMSCOPE_WATCH_BACKOFF_MAX``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection

from fleet import clusters, ingest
from fleet.ingest.cursors import record_leases
from fleet.kube.kubesource import KubeConfigError
from fleet.kube.lock import Heartbeat, StreamLock
from fleet.kube.reflector import Reflector, Round, StreamConfig
from fleet.kube.source import Source
from fleet.normalize import KINDS

log = logging.getLogger(__name__)

STREAM_KINDS: tuple[str, ...] = KINDS

_sources: dict[str, Source] = {}
_sources_lock = threading.Lock()


def stream_config() -> StreamConfig:
    timeout = float(getattr(settings, "CLAIMSCOPE_WATCH_TIMEOUT", 0) or 0)
    return StreamConfig(
        watch_timeout=timeout or float(random.randint(300, 600)),
        forbidden_retry=float(getattr(settings, "CLAIMSCOPE_WATCH_FORBIDDEN_RETRY", 300)),
        backoff_max=float(getattr(settings, "CLAIMSCOPE_WATCH_BACKOFF_MAX", 30)),
        flush_interval=float(getattr(settings, "CLAIMSCOPE_WATCH_FLUSH_MS", 250)) / 1000,
        lease=lock_ttl(),
    )


def lock_ttl() -> float:
    return float(getattr(settings, "CLAIMSCOPE_WATCH_LOCK_TTL", 10))


def source_for(config: clusters.ClusterConfig) -> Source:
    """One source (and HTTP connection pool) per cluster and process, shared by its streams."""
    with _sources_lock:
        if config.name not in _sources:
            _sources[config.name] = config.source()
        return _sources[config.name]


def redis_client() -> redis.Redis:
    url = getattr(settings, "REDIS_URL", None)
    if not url:
        raise clusters.ClusterConfigError("REDIS_URL is not set: stream locks need Redis")
    # Short timeouts: a heartbeat must not hang on a dead Redis longer than a fraction of the TTL.
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def run_round(name: str, kind: str, stop: threading.Event, failures: int = 0) -> Round:
    """Resume or list, then watch ``kind`` of cluster ``name`` until the server ends the watch.

    A cluster whose kubeconfig cannot be used (missing file, unknown context) is recorded as the stream's
    "error" state and retried slowly, like a forbidden stream; a cluster no longer configured ends the
    stream ("unconfigured").
    """
    config = stream_config()
    try:
        cluster = ingest.get_or_create_cluster(name)
    except DatabaseError as exc:
        close_old_connections()
        log.warning("%s/%s: database unavailable: %s", name, kind, exc)
        return Round("backoff", Reflector.backoff_for(config, failures), failures + 1)
    try:
        cluster_config = clusters.get(name)
    except clusters.ClusterConfigError as exc:
        # No longer configured (removed from CLAIMSCOPE_CLUSTERS): the stream ends here.
        log.error("%s/%s: %s; stopping this stream", name, kind, exc)
        return Round("unconfigured", 0.0, failures)
    try:
        source = source_for(cluster_config)
    except KubeConfigError as exc:
        log.error("%s/%s: %s", name, kind, exc)
        Reflector(cluster, kind, _NoSource(), config).record_state("error", str(exc))
        return Round("error", config.forbidden_retry, failures)
    with _leases.held(cluster.pk, kind):
        result = Reflector(cluster, kind, source, config).round(stop, failures)
    _promise_next_round(cluster.pk, name, kind, result.delay + config.lease)
    return result


def _promise_next_round(cluster_id: int, name: str, kind: str, seconds: float) -> None:
    """The stream stays vouched for until its next round is due (after the delay) plus a lease."""
    try:
        record_leases([(cluster_id, kind)], seconds)
    except DatabaseError as exc:  # the round just recorded that; the next round renews the lease
        log.warning("%s/%s: cannot extend the lease: %s", name, kind, exc)
        close_old_connections()


class _Leases:
    """The streams running in this process; one thread renews all their leases every third of a lease.

    The lease is how ``clusters``, the overview, the API and the readiness check tell a running stream
    from one whose worker died, froze or lost the database (``fleet.models.stream_status``). One thread
    and one statement for all streams: a thread per stream would cost a database connection each."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def held(self, cluster_id: int, kind: str) -> Iterator[None]:
        key = (cluster_id, kind)
        with self._lock:
            self._held[key] = self._held.get(key, 0) + 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew, name="stream leases", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                left = self._held.pop(key) - 1
                if left:
                    self._held[key] = left

    def _renew(self) -> None:
        try:
            while True:
                with self._lock:
                    keys = list(self._held)
                    if not keys:
                        self._thread = None
                        return
                lease = lock_ttl()
                try:
                    record_leases(keys, lease)
                except DatabaseError as exc:  # the streams see it too; the lease lapses and says so
                    log.warning("cannot renew the leases of %d stream(s): %s", len(keys), exc)
                    close_old_connections()
                time.sleep(lease / 3)
        finally:
            connection.close()  # this thread's own connection


_leases = _Leases()


class _NoSource:
    def list(self, kind: str) -> Any:
        raise NotImplementedError

    def watch(self, kind: str, resource_version: str, timeout_seconds: float | None = None) -> Any:
        raise NotImplementedError


def locked_round(
    client: redis.Redis, name: str, kind: str, stop: threading.Event, token: str = "", failures: int = 0
) -> tuple[Round | None, str | None]:
    """A round under the stream's lock. Returns (None, None) when another owner holds the lock; otherwise
    the round and the token handed to the successor (None if the lock was lost meanwhile)."""
    lock = StreamLock(client, name, kind, lock_ttl(), token)
    try:
        if not lock.acquire():
            return None, None
    except redis.RedisError as exc:
        log.warning("%s/%s: Redis unavailable (%s); not starting", name, kind, exc)
        return None, None
    with Heartbeat(lock, stop) as heartbeat:
        result = run_round(name, kind, stop, failures)
    if heartbeat.lost.is_set():
        return result, None
    try:
        successor = lock.hand_over(int((result.delay + lock_ttl()) * 1000))
    except redis.RedisError as exc:
        log.warning("%s/%s: cannot hand the lock over (%s); the beat will restart it", name, kind, exc)
        return result, None
    return result, successor


def release(token: str, name: str, kind: str) -> None:
    """Give up a stream's lock (held under ``token``) for good: its cluster is gone from the config."""
    StreamLock(redis_client(), name, kind, lock_ttl(), token).release()
