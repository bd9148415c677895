"""Security plumbing: the probe shortcut, login rate limiting (django-axes) and security logging.

Login attempts are counted by django-axes (its database handler: one table shared by every web replica,
visible in the admin, reset with ``manage.py axes_reset``). Failures, lockouts and permission denials are
also logged here, on the ``claimscope.security`` logger, in one greppable format with the username, the
client address and the path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from axes.backends import AxesStandaloneBackend
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

from dashboard.views import healthz, readyz
from fleet.access import audit
from web.clients import client_ip
from web.sockets import session_group

log = logging.getLogger("claimscope.security")

PROBES = {"/healthz": healthz, "/readyz": readyz}


class ProbeMiddleware:
    """Answers ``GET /healthz`` and ``/readyz`` before host validation and the HTTPS redirect.

    Kubelet and Docker probes call the pod's own address over plain http: with ``ALLOWED_HOSTS`` set to the
    public name and ``SECURE_SSL_REDIRECT`` on, they would get a 400 or a 301 instead of the health status.
    The answer carries only check results and counts (dashboard/health.py). Must be first in ``MIDDLEWARE``.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        if probe is not None and request.method in ("GET", "HEAD"):
            return probe(request)
        return self.get_response(request)


class LoginAttemptBackend(AxesStandaloneBackend):
    """django-axes' lockout check, skipped for authentications without a request.

    Every login over HTTP (the login page, the admin, DRF) passes the request, so it is rate-limited.
    Code that calls ``authenticate()`` without one (Django's test ``Client.login``, management commands) has
    no client address to count against; axes would raise there instead of authenticating.
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> None:
        if request is None:
            return None
        super().authenticate(request, username, password, **kwargs)
        return None


class TrustedProxyMiddleware:
    """ASGI middleware: the client address and scheme from ``X-Forwarded-For``/``-Proto``, only when the peer
    is one of ``settings.TRUSTED_PROXIES`` (none by default), for HTTP and websockets alike.

    uvicorn's own ProxyHeadersMiddleware does the parsing (rightmost untrusted hop of X-Forwarded-For); the
    server must run with ``--no-proxy-headers``, otherwise uvicorn already believes 127.0.0.1 before this
    sees the request. Settings are read per connection so that tests can change them.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._trusted: tuple[str, ...] = ()
        self._inner: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        trusted = tuple(settings.TRUSTED_PROXIES)
        if not trusted:
            return await self.app(scope, receive, send)
        if trusted != self._trusted or self._inner is None:
            from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

            self._inner, self._trusted = ProxyHeadersMiddleware(self.app, list(trusted)), trusted
        return await self._inner(scope, receive, send)


@receiver(user_login_failed, dispatch_uid="claimscope.security.login_failed")
def log_login_failure(
    sender: object, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    # Django hides the password in ``credentials`` already; log the username only.
    locked = bool(getattr(request, "axes_locked_out", False))
    log.warning(
        "login failed: username=%r ip=%s path=%s%s",
        credentials.get("username", ""),
        client_ip(request),
        getattr(request, "path", "-"),
        " (locked out: too many failures)" if locked else "",
    )
    audit.record("login failed", str(credentials.get("username", "")), request, locked_out=locked)


@receiver(user_logged_in, dispatch_uid="claimscope.security.audit_login")
def audit_login(sender: object, request: HttpRequest | None = None, user: Any = None, **kwargs: Any) -> None:
    backend = getattr(user, "backend", "") or ""
    audit.record("login", user.get_username() if user is not None else "", request, backend=backend)


@receiver(user_logged_out, dispatch_uid="claimscope.security.audit_logout")
def audit_logout(sender: object, request: HttpRequest | None = None, user: Any = None, **kwargs: Any) -> None:
    if user is not None:
        audit.record("logout", user.get_username(), request)


@receiver(user_logged_out, dispatch_uid="claimscope.security.close_websockets")
def close_session_websockets(
    sender: object, request: HttpRequest | None = None, user: Any = None, **kwargs: Any
) -> None:
    """Logout ends the session for websockets too: every socket opened with this session closes.

    Sent before Django flushes the session, so the key is still known. A socket that reconnects with the old
    cookie finds no session and is refused (``fleet.consumers``)."""
    session = getattr(request, "session", None)
    key = getattr(session, "session_key", None)
    if key is None and user is None:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            session_group(key, getattr(user, "pk", None)), {"type": "session.end"}
        )
    except Exception:  # the logout itself must not fail because Redis is away; sockets then end on reconnect
        log.exception("logout: could not close the websockets of user=%r", getattr(user, "username", None))


class DenialLogMiddleware:
    """Logs every 403 answer (Django's PermissionDenied, DRF permission checks, CSRF failures) with the user,
    the client address, the method and the path. Place it outside the CSRF and authentication middleware so
    that it sees their answers."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code == 403:
            user = getattr(request, "user", None)
            name = user.get_username() if user is not None and user.is_authenticated else "<anonymous>"
            log.warning(
                "permission denied: user=%r ip=%s %s %s",
                name,
                client_ip(request),
                request.method,
                request.get_full_path(),
            )
        return response
