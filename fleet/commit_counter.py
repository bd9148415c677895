"""The fleet's commit counter: a counter ingest bumps after each batch commits, so cache keys follow commits.

Cache keys built only from row counts and ``max(synced_at)`` can miss a committed change: ingest stamps
``synced_at`` before its transaction commits, so a batch that stamped earlier but committed later (two
streams at once) leaves the maximum where it was and the cached overview or summary stays stale until
it expires. Bumping a shared counter after the commit orders every key after the change it must show:
a reader that sees the new count also sees the committed rows.
"""

from __future__ import annotations

import logging
import threading
import time

from django.core.cache import cache
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

OUTAGE_LOG_SECONDS = 30.0
_outage_logged: dict[str, float] = {}
_outage_lock = threading.Lock()


def log_failure(logger: logging.Logger, message: str, exc: BaseException) -> None:
    """Log a failed side effect of ingest: with its traceback, unless Redis is unreachable; then one line
    per ``message`` every ``OUTAGE_LOG_SECONDS`` (an outage would otherwise log a traceback per batch)."""
    if not isinstance(exc, (RedisError, OSError, BrokerError)):  # BrokerError: Celery's enqueue
        logger.error(message, exc_info=exc)
        return
    now = time.monotonic()
    with _outage_lock:
        if now - _outage_logged.get(message, -OUTAGE_LOG_SECONDS) < OUTAGE_LOG_SECONDS:
            return
        _outage_logged[message] = now
    logger.warning("%s: Redis unreachable (%s: %s)", message, type(exc).__name__, exc)


KEY = "fleet:commits"


def bump() -> None:
    """Count one committed fleet change (called on commit; a cache failure is logged, never raised:
    the row counts and timestamps in the keys still move with most changes)."""
    try:
        if not cache.add(KEY, 1, timeout=None):
            cache.incr(KEY)
    except Exception as exc:
        log_failure(log, "could not count a fleet commit; cached overviews may lag until they expire", exc)


def current() -> int:
    """The count now (0 before the first change, or when the cache is unreachable)."""
    try:
        return int(cache.get(KEY, 0))
    except Exception:
        log.exception("could not read the fleet commit counter")
        return 0
