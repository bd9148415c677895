"""The audit trail: one call, :func:`record`, writes a row of ``fleet.AuditEvent`` (the table operators read
in the admin) and the same event as a log line on the ``claimscope.audit`` logger.

Recorded: logins, failed logins and lockouts, logouts, API token creation, use (first use per minute, so a
busy script does not write a row per request) and revocation, rejected tokens, and exports (every CSV answer
and every API list read with a token: scripts, not the pages' own calls).
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest
from django.utils import timezone

log = logging.getLogger("claimscope.audit")


def record(action: str, username: str, request: HttpRequest | None = None, **detail: Any) -> None:
    """Store and log one event. Never raises: an audit write must not turn a login into a 500."""
    from dashboard.security import client_ip
    from fleet.models import AuditEvent

    ip = client_ip(request)
    text = " ".join(f"{k}={v!r}" for k, v in sorted(detail.items()))
    log.info("%s: username=%r ip=%s%s", action, username, ip, f" {text}" if text else "")
    try:
        AuditEvent.objects.create(
            at=timezone.now(),
            action=action,
            username=username[:150],
            ip="" if ip == "-" else ip,
            detail=detail,
        )
    except Exception:
        log.exception("audit: could not store %s for %r", action, username)
