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

from axes.backends import AxesStandaloneBackend
from django.contrib.auth.signals import user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

from dashboard.views import healthz

log = logging.getLogger("claimscope.security")

PROBE_PATH = "/healthz"


class ProbeMiddleware:
    """Answers ``GET /healthz`` before host validation and the HTTPS redirect.

    Kubelet and Docker probes call the pod's own address over plain http: with ``ALLOWED_HOSTS`` set to the
    public name and ``SECURE_SSL_REDIRECT`` on, they would get a 400 or a 301 instead of the health status.
    The answer carries no data beyond ``{"status": ...}``. Must be first in ``MIDDLEWARE``.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info == PROBE_PATH and request.method in ("GET", "HEAD"):
            return healthz(request)
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


def client_ip(request: HttpRequest | None) -> str:
    """The peer address as the ASGI server reports it (uvicorn resolves X-Forwarded-For from trusted
    proxies, see FORWARDED_ALLOW_IPS in docs/operations.md)."""
    if request is None:
        return "-"
    return str(request.META.get("REMOTE_ADDR") or "-")


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
