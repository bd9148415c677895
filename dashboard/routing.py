"""Websocket routes."""

from typing import Any

from django.urls import path, re_path

from claims.consumers import PendingConsumer
from dashboard.consumers import UnknownPathConsumer
from fleet.consumers import FleetConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/fleet/", FleetConsumer.as_asgi()),
    path("ws/pending/", PendingConsumer.as_asgi()),
    re_path(r"", UnknownPathConsumer.as_asgi()),  # last: every other path is refused cleanly
]
