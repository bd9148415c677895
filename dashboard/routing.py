"""Websocket routes."""

from typing import Any

from django.urls import path

from claims.consumers import PendingConsumer
from fleet.consumers import FleetConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/fleet/", FleetConsumer.as_asgi()),
    path("ws/pending/", PendingConsumer.as_asgi()),
]
