"""The websocket route of last resort: an unknown path is refused at the handshake, with a log line."""

from __future__ import annotations

import logging

from channels.generic.websocket import WebsocketConsumer

log = logging.getLogger(__name__)


class UnknownPathConsumer(WebsocketConsumer):
    """Refuses the handshake of a websocket path no route serves (the ASGI server answers 403), instead
    of Channels' router raising, which the server logs as a 500 with a traceback."""

    def connect(self) -> None:
        log.info("websocket refused: no route for %s", self.scope.get("path", "")[:200])
        self.close()
