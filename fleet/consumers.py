"""The ``/ws/fleet/`` consumer: authenticate, subscribe to fleet changes, forward versioned messages.

The snapshot/delta logic is :class:`fleet.feed.FleetFeed`; this only moves messages. Deltas are flushed at
most once per ``fleet_feed.BATCH_SECONDS``: change events inside that window coalesce into one message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qsl

import orjson
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from fleet import feed as fleet_feed
from fleet.filters import FilterError, parse_filters

log = logging.getLogger(__name__)
BAD_REQUEST = 4400
UNAUTHORIZED = 4401


class FleetConsumer(AsyncJsonWebsocketConsumer):
    """Streams heatmap rows for the filters in the query string to a logged-in user."""

    feed: fleet_feed.FleetFeed
    flusher: asyncio.Task[None] | None = None
    lock: asyncio.Lock

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        return orjson.dumps(content).decode()

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=UNAUTHORIZED)
            return
        query = dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))
        try:
            self.feed = fleet_feed.FleetFeed(parse_filters(query))
            self.lock = asyncio.Lock()
        except FilterError as exc:
            await self.accept()
            await self.send_json({"type": "error", "parameter": exc.parameter, "message": str(exc)})
            await self.close(code=BAD_REQUEST)
            return
        await self.channel_layer.group_add(settings.CLAIMSCOPE_INGEST_GROUP, self.channel_name)
        await self.accept()
        await self._send(self.feed.snapshot)

    async def disconnect(self, code: int) -> None:
        if self.flusher is not None:
            self.flusher.cancel()
        if hasattr(self, "feed"):
            await self.channel_layer.group_discard(settings.CLAIMSCOPE_INGEST_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            await self._send(self.feed.snapshot)

    async def fleet_change(self, event: dict[str, Any]) -> None:
        """A committed ingest batch: mark it, and flush within the batching window."""
        if self.feed.mark(event) and self.flusher is None:
            self.flusher = asyncio.ensure_future(self._flush_later())

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(fleet_feed.BATCH_SECONDS)
        finally:
            self.flusher = None
        try:
            await self._send(self.feed.delta)
        except Exception:  # the clusters stay dirty: the next change retries them
            log.exception("fleet feed: delta failed")

    async def _send(self, build: Any) -> None:
        # One message at a time, in version order: a snapshot and a delta never interleave.
        async with self.lock:
            message = await database_sync_to_async(build)()
            if message is not None:
                await self.send_json(message)
