"""Security plumbing: the probe shortcut, login rate limiting (django-axes) and security logging.

Login attempts are counted by django-axes (its database handler: one table shared by every web replica,
visible in the admin, reset with ``manage.py axes_reset``). Failures, lockouts and permission denials are
also logged here, on the ``claimscope.security`` logger, in one greppable format with the username, the
client address and the path.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from asgiref.sync import async_to_sync
from axes.backends import AxesStandaloneBackend
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from redis.exceptions import RedisError

from dashboard import audit
from dashboard.views import healthz, readyz

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


def client_address(request: HttpRequest | None) -> str | None:
    """The client address for the login lockout (AXES_CLIENT_IP_CALLABLE): the peer, or what a trusted
    proxy forwarded (TrustedProxyMiddleware); None without a request."""
    if request is None:
        return None
    return request.META.get("REMOTE_ADDR") or None


def client_ip(request: HttpRequest | None) -> str:
    """The client address for logs: :func:`client_address`, ``-`` when unknown."""
    return client_address(request) or "-"


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


def session_group(session_key: str | None, user_id: Any) -> str:
    """The channel-layer group of the websockets opened with one login session (by user when the
    connection has no session). Group names allow ASCII letters, digits, ``-``, ``_`` and ``.``; session keys
    are letters and digits, hashed anyway so the key itself never travels through Redis."""
    if session_key:
        return "session-" + hashlib.sha256(session_key.encode()).hexdigest()[:32]
    return f"user-{user_id}"


SESSION_ENDED = 4401  # websocket close code: the login session behind the socket ended
BAD_QUERY = 4400  # websocket close code: a query-string parameter is invalid (an error message precedes it)
LAYER_UNAVAILABLE = 1013  # "try again later": the channel layer (Redis) did not answer while connecting
LAYER_LOST = 1012  # "service restart": the channel layer lost Redis, and with it this socket's groups
LAYER_TIMEOUT = 5.0  # seconds for joining the groups, per attempt
LAYER_ERRORS = (RedisError, OSError, TimeoutError)
T = TypeVar("T")


class SessionBoundConsumer:
    """Mixin for Channels websocket consumers: the socket closes when its login session ends (logout).

    Call :meth:`join_session_group` in ``connect`` (after authenticating) and :meth:`leave_session_group` in
    ``disconnect``; :meth:`session_end` handles the ``session.end`` message the logout signal sends.
    """

    scope: Any
    channel_layer: Any
    channel_name: str
    session_group: str | None = None

    async def open_with(
        self, parse: Callable[[dict[str, str]], T], errors: tuple[type[Exception], ...]
    ) -> T | None:
        """What every consumer's ``connect`` starts with: a logged-in user, then its query string parsed by
        ``parse``. Returns the parsed value, or None after closing the socket: 4401 without a login; 4400
        after an ``{"type": "error", "parameter", "message"}`` message when ``parse`` raises one of
        ``errors`` (exceptions with a ``parameter`` attribute)."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=SESSION_ENDED)  # type: ignore[attr-defined]
            return None
        query = dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))
        try:
            return parse(query)
        except errors as exc:
            await self.accept()  # type: ignore[attr-defined]
            message = {"type": "error", "parameter": getattr(exc, "parameter", ""), "message": str(exc)}
            await self.send_json(message)  # type: ignore[attr-defined]
            await self.close(code=BAD_QUERY)  # type: ignore[attr-defined]
            return None

    async def join_session_group(self) -> None:
        session = self.scope.get("session")
        user = self.scope.get("user")
        self.session_group = session_group(getattr(session, "session_key", None), getattr(user, "pk", None))
        await self.channel_layer.group_add(self.session_group, self.channel_name)

    async def join_groups(self, *groups: str) -> bool:
        """Join the session group and ``groups``. False after refusing the socket cleanly (accept, then
        close with 1013) when the channel layer does not answer: never a 500 or a hanging handshake.

        Tried twice: after a Redis restart the first command on a pooled connection fails, and the
        next one connects again."""
        failure: BaseException | None = None
        for attempt in range(2):
            try:
                async with asyncio.timeout(LAYER_TIMEOUT):
                    await self.join_session_group()
                    for group in groups:
                        await self.channel_layer.group_add(group, self.channel_name)
                return True
            except LAYER_ERRORS as exc:
                failure = exc
                if attempt == 0:
                    await asyncio.sleep(0.2)
        log.warning("websocket refused: channel layer unavailable (%s: %s)", type(failure).__name__, failure)
        await self.accept()  # type: ignore[attr-defined]
        await self.close(code=LAYER_UNAVAILABLE)  # type: ignore[attr-defined]
        return False

    async def leave_groups(self, *groups: str) -> None:
        """Leave the session group and ``groups``; a channel layer that went away has forgotten them."""
        try:
            async with asyncio.timeout(LAYER_TIMEOUT):
                if self.session_group is not None:
                    await self.channel_layer.group_discard(self.session_group, self.channel_name)
                for group in groups:
                    await self.channel_layer.group_discard(group, self.channel_name)
        except LAYER_ERRORS as exc:
            log.info("websocket closed without leaving its groups: %s: %s", type(exc).__name__, exc)

    async def leave_session_group(self) -> None:
        await self.leave_groups()

    async def channel_lost(self, event: dict[str, Any]) -> None:
        """The channel layer lost Redis (dashboard/channel_layer.py): this socket's groups are gone, so it
        closes and the page reconnects and joins again."""
        await self.close(code=LAYER_LOST)  # type: ignore[attr-defined]

    async def session_end(self, event: dict[str, Any]) -> None:
        await self.close(code=SESSION_ENDED)  # type: ignore[attr-defined]


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
