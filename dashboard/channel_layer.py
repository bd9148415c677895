"""The Redis channel layer, with what a lost Redis means for a websocket made explicit.

channels-redis raises a connection error out of ``receive`` when Redis goes away, which kills the consumer
without a close frame. The groups a socket joined are gone with Redis anyway (a restart without persistence
forgets them), so the socket cannot simply resume: ``receive`` hands the consumer a ``channel.lost`` message
instead, and the consumer closes the socket cleanly (``web.sockets.SessionBoundConsumer``), which
the pages answer by reconnecting and joining again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels_redis.core import RedisChannelLayer
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

LOST_PAUSE = 1.0  # seconds before reporting a loss again: the consumer is closing meanwhile


class ReconnectingRedisChannelLayer(RedisChannelLayer):
    async def receive(self, channel: str) -> dict[str, Any]:
        try:
            return dict(await super().receive(channel))
        except (RedisError, OSError) as exc:
            log.warning(
                "channel layer: lost Redis while receiving for a websocket (%s: %s)", type(exc).__name__, exc
            )
            await asyncio.sleep(LOST_PAUSE)
            return {"type": "channel.lost"}
