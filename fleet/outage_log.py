"""Logging of ingest's side effects that fail (change events, listeners): a Redis outage is logged once per
``OUTAGE_LOG_SECONDS`` per message, not with a traceback per batch; any other failure with its traceback."""

from __future__ import annotations

import logging
import threading
import time

from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

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
