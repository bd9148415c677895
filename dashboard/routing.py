"""Websocket routes (the fleet feed is added by the heatmap work)."""

from typing import Any

websocket_urlpatterns: list[Any] = []
