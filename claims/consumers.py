"""The ``/ws/pending/`` consumer: tells a logged-in pending page that its rows may have changed.

Two sources: ingest's fleet changes (claims and pods created, allocated, deleted) and the diagnosis task
(``notify_pending_changed`` after it stored new diagnoses). A message carries no claim data at all, only a
version number, the cluster names and, when it announces stored diagnoses, when the newest of them were
stored (``diagnosed_at``, seconds since the epoch): the page refetches its rows over HTTP, where the
user's namespace visibility applies. So nothing a user may not see ever crosses the socket, and a lost
message only delays an update. Authentication and the origin check come from the ASGI stack
(``dashboard/asgi.py``), and the socket closes when its login session ends
(``web.sockets.SessionBoundConsumer``), as for ``/ws/fleet/``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from claims.selectors import QueryError, parse_pending_query
from web.sockets import BAD_QUERY, SESSION_ENDED, SessionBoundConsumer, after_window

log = logging.getLogger(__name__)
PENDING_GROUP = "claims-pending"
BAD_REQUEST = BAD_QUERY  # 4400: a bad query-string parameter
UNAUTHORIZED = SESSION_ENDED  # 4401: not logged in, or the session ended (logout)
# A change after a quiet window is told at once; changes within the window after a message coalesce into
# the next (each message makes open pages refetch rows). Ingest's changes of claims and pods come every
# batch under churn: at most one message per BATCH_SECONDS for them. Stored diagnoses, what the page is
# watched for, wait at most DIAGNOSED_SECONDS: with the longer window alone they waited for the end of one
# opened by an ingest change, 0.25 s on average (bench_e2e, L). The page coalesces its refetches itself
# (300 ms), so the shorter window adds messages, not refetches.
BATCH_SECONDS = 0.5
DIAGNOSED_SECONDS = 0.1
# Kinds whose ingest changes can add, remove or re-diagnose a pending row.
RELEVANT_KINDS = frozenset({"ResourceClaim", "Pod", "ResourceClaimTemplate", "Event"})


class PendingConsumer(SessionBoundConsumer, AsyncJsonWebsocketConsumer):
    """Sends ``{"type": "changed", "version": n, "clusters": [...]}`` when pending rows may have changed."""

    cluster = ""
    version = 0
    dirty: set[str]
    flusher: asyncio.Task[None] | None = None
    flushed_at = float("-inf")  # when the last message started (the event loop's clock)
    due = float("inf")  # when the scheduled message starts
    diagnosed_at: float | None = None  # when the newest diagnoses the next message announces were stored

    async def connect(self) -> None:
        query = await self.open_with(parse_pending_query, (QueryError,))
        if query is None:
            return
        self.cluster = query.cluster
        self.dirty = set()
        if not await self.join_groups(settings.CLAIMSCOPE_INGEST_GROUP, PENDING_GROUP):
            return
        await self.accept()
        self.version = 1
        await self.send_json({"type": "hello", "version": self.version})

    async def disconnect(self, code: int) -> None:
        if self.flusher is not None:
            self.flusher.cancel()
        await self.leave_groups(
            *([settings.CLAIMSCOPE_INGEST_GROUP, PENDING_GROUP] if hasattr(self, "dirty") else [])
        )

    async def fleet_change(self, event: dict[str, Any]) -> None:
        if event.get("kind") in RELEVANT_KINDS:
            self._mark(str(event.get("cluster", "")), BATCH_SECONDS)

    async def pending_change(self, event: dict[str, Any]) -> None:
        cluster = str(event.get("cluster", ""))
        if self.cluster and cluster != self.cluster:
            return
        at = event.get("at")
        if isinstance(at, int | float):
            self.diagnosed_at = max(self.diagnosed_at or at, at)
        self._mark(cluster, DIAGNOSED_SECONDS)

    def _mark(self, cluster: str, window: float) -> None:
        """Schedule a message ``window`` after the last one started (at once if that is past), or move the
        scheduled one earlier to then."""
        if self.cluster and cluster != self.cluster:
            return
        self.dirty.add(cluster)
        due = self.flushed_at + window
        if self.flusher is not None:
            if due >= self.due:
                return
            self.flusher.cancel()  # still waiting: it clears ``flusher`` before its first other await
        self.due = due
        self.flusher = asyncio.ensure_future(self._flush_later(window))

    async def _flush_later(self, window: float) -> None:
        self.flushed_at = await after_window(self.flushed_at, window)
        self.flusher, self.due = None, float("inf")
        clusters, self.dirty = sorted(self.dirty), set()
        self.version += 1
        message: dict[str, Any] = {"type": "changed", "version": self.version, "clusters": clusters}
        if self.diagnosed_at is not None:
            message["diagnosed_at"], self.diagnosed_at = self.diagnosed_at, None
        await self.send_json(message)


def notify_pending_changed(cluster: str) -> None:
    """Tell open pending pages that the diagnoses of ``cluster`` changed. Never raises: the database is the
    truth and a lost notification only delays a page update."""
    layer = get_channel_layer()
    if layer is None:
        return
    event = {"type": "pending.change", "cluster": cluster, "at": time.time()}  # at the commit (on_commit)
    try:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            task = loop.create_task(layer.group_send(PENDING_GROUP, event))
            _sending.add(task)
            task.add_done_callback(_sending.discard)
        else:
            async_to_sync(layer.group_send)(PENDING_GROUP, event)
    except Exception:
        log.exception("could not notify pending pages of %s", cluster)


_sending: set[asyncio.Task[None]] = set()  # keeps scheduled sends alive until done
