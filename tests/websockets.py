"""What the websocket tests share: an in-memory channel layer, a logged-in session's cookie header, and a
runner for async test bodies (no pytest-asyncio here)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import Client, override_settings

ORIGIN = (b"origin", b"http://127.0.0.1")  # an allowed host: the origin check lets it through
IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@contextmanager
def in_memory_channel_layer() -> Iterator[None]:
    """The in-memory layer, fresh (Channels caches layer instances across settings changes)."""
    with override_settings(CHANNEL_LAYERS=IN_MEMORY):
        from channels.layers import channel_layers

        channel_layers.backends.clear()
        yield
        channel_layers.backends.clear()


def session_cookie(client: Client, user: Any) -> tuple[bytes, bytes]:
    """The ``cookie`` header of ``user``'s session, logged in through the test client."""
    client.force_login(user)
    value = client.cookies[settings.SESSION_COOKIE_NAME].value
    return b"cookie", f"{settings.SESSION_COOKIE_NAME}={value}".encode()


def run_async(test: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Run an async test body in an event loop; its fixtures stay sync."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return async_to_sync(test)(*args, **kwargs)

    return wrapper
