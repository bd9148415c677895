"""The ``/ws/fleet/`` consumer: authenticate, subscribe to fleet changes, forward versioned messages.

The snapshot/delta logic is :class:`fleet.feed.FleetFeed`; this only moves messages. Deltas start at most
once per ``fleet_feed.BATCH_SECONDS``: a change after a quiet window goes out at once, and the change events
that arrive within the window after a delta coalesce into the next one.
While connected, the consumer counts as a listener of the process-wide GPU cache: every change event it
receives goes to :meth:`fleet.feed.FleetFeed.mark`, which passes the pools it names to the cache, so the
cache re-reads those pools only instead of checking every pool of the fleet.

Each connection also joins its login session's group (:func:`web.sockets.session_group`): logging
out sends ``session.end`` there and every socket of that session closes. Rows pass through
:func:`fleet.access.visibility.redact_heatmap_rows` for this connection's user after they are built, so a
feed shared between connections never carries one user's view to another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from fleet import feed as fleet_feed
from fleet.access.visibility import Visibility, redact_heatmap_rows, visibility_for
from fleet.filters import FilterError, parse_filters
from web.sockets import BAD_QUERY, SESSION_ENDED, SessionBoundConsumer, after_window

log = logging.getLogger(__name__)

# The feed's own threads, not asyncio's default executor (cores + 4 threads): each thread that touches the
# database keeps a persistent connection (DB_CONN_MAX_AGE), so this bounds a web process's feed
# connections at FEED_THREADS. Builds of different connections mostly wait on the shared cache's lock
# anyway: more threads would add connections, not throughput.
FEED_THREADS = 2
FEED_EXECUTOR = ThreadPoolExecutor(max_workers=FEED_THREADS, thread_name_prefix="fleet-feed")


def _with_checked_connection(build: Callable[[], Any]) -> Callable[[], Any]:
    """``build`` after Django's per-request connection check, run inside the call itself.

    ``database_sync_to_async`` runs that check too, but on this executor it does not reach the connection
    the call then uses: a persistent connection the server dropped (restart, failover, a terminated
    backend) failed the next snapshot or delta with "terminating connection due to administrator command"
    instead of being replaced (tests/fleet_pages/test_websocket.py)."""

    def run() -> Any:
        close_old_connections()  # with CONN_HEALTH_CHECKS: a dead connection is replaced before use
        return build()

    return run


BAD_REQUEST = BAD_QUERY  # 4400: a bad query-string parameter
UNAUTHORIZED = SESSION_ENDED  # 4401: not logged in, or the session ended (logout)


class FleetConsumer(SessionBoundConsumer, AsyncJsonWebsocketConsumer):
    """Streams heatmap rows for the filters in the query string to a logged-in user."""

    feed: fleet_feed.FleetFeed
    flusher: asyncio.Task[None] | None = None
    flushed_at = float("-inf")  # when the last delta started (the event loop's clock)
    listening = False  # counted among the GPU cache's listeners (see fleet.feed.GpuCache.listen)
    lock: asyncio.Lock
    vis: Visibility

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        return orjson.dumps(content).decode()

    async def connect(self) -> None:
        filters = await self.open_with(parse_filters, (FilterError,))
        if filters is None:
            return
        user = self.scope["user"]
        self.feed = fleet_feed.FleetFeed(filters)
        self.lock = asyncio.Lock()
        self.vis = await database_sync_to_async(visibility_for)(user)
        if not await self.join_groups(settings.CLAIMSCOPE_INGEST_GROUP):
            return
        fleet_feed.CACHE.listen()  # after joining: the cache checks everything if nobody listened before
        self.listening = True
        try:
            await self.accept()
            await self._send(self.feed.snapshot)
        except BaseException:  # the consumer dies without disconnect(): a listener must not outlive it
            fleet_feed.CACHE.unlisten()
            self.listening = False
            raise

    async def disconnect(self, code: int) -> None:
        if self.flusher is not None:
            self.flusher.cancel()
        if self.listening:
            fleet_feed.CACHE.unlisten()
            self.listening = False
        await self.leave_groups(*([settings.CLAIMSCOPE_INGEST_GROUP] if hasattr(self, "feed") else []))

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            await self._send(self.feed.snapshot)

    async def fleet_change(self, event: dict[str, Any]) -> None:
        """A committed ingest batch: mark it (its pools in the shared cache, its cluster for this client),
        and flush it now, or at the end of the window of the last delta."""
        if self.feed.mark(event) and self.flusher is None:
            self.flusher = asyncio.ensure_future(self._flush_later())

    async def _flush_later(self) -> None:
        try:
            self.flushed_at = await after_window(self.flushed_at, fleet_feed.BATCH_SECONDS)
        finally:
            self.flusher = None
        try:
            await self._send(self.feed.delta)
        except DatabaseError as exc:
            # The database is away (a restart, a failover): one line, not a traceback per delta; the clusters
            # stay dirty and the next change retries them.
            log.warning(
                "fleet feed: delta postponed, no answer from the database: %s", str(exc).strip()[:200]
            )
        except Exception:  # the clusters stay dirty: the next change retries them
            log.exception("fleet feed: delta failed")

    async def _send(self, build: Any) -> None:
        # One message at a time, in version order: a snapshot and a delta never interleave.
        async with self.lock:
            # Not Django's one shared sync thread (thread_sensitive): every sync view of this process runs
            # there, so a slow page would hold every client's deltas behind it. The cache has its own lock
            # and this feed is used under self.lock, so another thread is safe.
            message = await database_sync_to_async(
                _with_checked_connection(build), thread_sensitive=False, executor=FEED_EXECUTOR
            )()
            if message is not None:
                if "rows" in message:
                    message = {**message, "rows": redact_heatmap_rows(message["rows"], self.vis)}
                await self.send_json(message)
