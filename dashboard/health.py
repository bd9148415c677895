"""What the health endpoints report: the database, Redis and whether every watch stream is vouched for.

``/healthz`` (liveness) reports and answers 200 whenever this process serves: restarting a web process does
not bring a database back. ``/readyz`` (readiness) answers 503 while the database or Redis is unreachable, so
a load balancer stops sending requests this process cannot answer. Stale streams (no worker reported within
the lease, ``fleet.models.stream_status``) make the status "degraded" in both, without failing either: the
pages still serve the last data, with the stale streams named on the overview. Only counts are reported:
the endpoints need no login.
"""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from fleet.models import WatchCursor, stream_status

TIMEOUT = 2.0  # seconds per check: a probe must answer before its own timeout


def database() -> str:
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
    except Exception as exc:  # report, don't raise: probes want a status, not a traceback
        return type(exc).__name__
    return "ok"


def redis_status() -> str:
    url = getattr(settings, "REDIS_URL", None)
    if not url:
        return "not configured"
    try:
        client = redis.Redis.from_url(url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as exc:
        return type(exc).__name__
    return "ok"


def streams() -> dict[str, int] | str:
    try:
        rows = list(WatchCursor.objects.values_list("state", "lease_until"))
    except DatabaseError as exc:
        return type(exc).__name__
    now = timezone.now()
    stale = sum(stream_status(state, lease, now) == "stale" for state, lease in rows)
    return {"total": len(rows), "stale": stale}


def report() -> tuple[dict[str, Any], bool]:
    """The report and whether this process is ready (database and, when configured, Redis reachable)."""
    db = database()
    checks: dict[str, Any] = {"database": db, "redis": redis_status()}
    checks["streams"] = streams() if db == "ok" else "unknown"
    ready = db == "ok" and checks["redis"] in ("ok", "not configured")
    stale = isinstance(checks["streams"], dict) and checks["streams"]["stale"] > 0
    status = "error" if not ready else "degraded" if stale else "ok"
    return {"status": status, **checks}, ready
