"""The client address of a request: the peer, or what a trusted proxy forwarded (the ASGI
``TrustedProxyMiddleware`` in ``dashboard.security`` rewrites the peer only for configured proxies)."""

from __future__ import annotations

from django.http import HttpRequest


def client_address(request: HttpRequest | None) -> str | None:
    """The client address for the login lockout (AXES_CLIENT_IP_CALLABLE): the peer, or what a trusted
    proxy forwarded (TrustedProxyMiddleware); None without a request."""
    if request is None:
        return None
    return request.META.get("REMOTE_ADDR") or None


def client_ip(request: HttpRequest | None) -> str:
    """The client address for logs: :func:`client_address`, ``-`` when unknown."""
    return client_address(request) or "-"
