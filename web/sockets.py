"""The websocket consumer base of every live page: a logged-in user, a parsed query string, and a socket
that closes when its login session ends (logout) or when the channel layer loses Redis."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from redis.exceptions import RedisError

log = logging.getLogger("claimscope.security")


async def after_window(started: float, window: float) -> float:
    """Wait until ``window`` seconds after ``started`` (the event loop's clock: when the last message of a
    throttled stream started), and return the time then. A message after a quiet window goes out at once;
    what comes within the window after one waits for its end, and what arrives meanwhile coalesces."""
    loop = asyncio.get_running_loop()
    wait = started + window - loop.time()
    if wait > 0:
        await asyncio.sleep(wait)
    return loop.time()


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
