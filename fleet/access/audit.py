"""The audit trail: one call, :func:`record`, writes a row of ``fleet.AuditEvent`` (the table operators read
in the admin) and the same event as a log line on the ``claimscope.audit`` logger.

Recorded: logins, failed logins and lockouts, logouts, API token creation, use (first use per minute, so a
busy script does not write a row per request) and revocation, rejected tokens, and exports (every CSV answer
and every API list read with a token: scripts, not the pages' own calls).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

log = logging.getLogger("claimscope.audit")


def record(action: str, username: str, request: HttpRequest | None = None, **detail: Any) -> None:
    """Store and log one event. Never raises: an audit write must not turn a login into a 500."""
    from fleet.models import AuditEvent
    from web.clients import client_ip

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


class ExportAuditMiddleware:
    """Records API answers that leave with data: every successful CSV, and every successful API read made
    with a token (scripts). The pages' own JSON calls (session, no token) are not exports.

    A Django middleware, after DRF: DRF sets ``request.user`` and ``request.auth`` on the Django request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code != 200 or not request.path_info.startswith("/api/"):
            return response
        from fleet.models import ApiToken

        csv = response.get("Content-Type", "").startswith("text/csv")
        token = getattr(request, "auth", None)
        if csv or isinstance(token, ApiToken):
            user = getattr(request, "user", None)
            record(
                "export",
                user.get_username() if user is not None and user.is_authenticated else "",
                request,
                path=request.get_full_path()[:500],
                format="csv" if csv else "json",
                via="token" if isinstance(token, ApiToken) else "session",
            )
        return response
