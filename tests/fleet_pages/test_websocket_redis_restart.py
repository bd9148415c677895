"""/ws/fleet/ and /ws/pending/ across a restart of the channel layer's Redis (a private redis-server).

Sockets open during the restart close cleanly with 1012 (their groups went with Redis; the page reconnects),
a handshake while Redis is down is refused cleanly with 1013 (not a 500, not a hang), and the first
handshake after Redis is back succeeds.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from dashboard.asgi import application
from tests.websockets import ORIGIN, run_async, session_cookie
from web.sockets import LAYER_LOST, LAYER_UNAVAILABLE

pytestmark = pytest.mark.django_db(transaction=True)


class RedisServer:
    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not installed (make test installs it)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Gone at once, keys and all, as after a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    layers = {
        "default": {
            "BACKEND": "dashboard.channel_layer.ReconnectingRedisChannelLayer",
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{server.port}/0", "socket_timeout": 15}]},
        }
    }
    try:
        with override_settings(CHANNEL_LAYERS=layers):
            channel_layers.backends.clear()
            yield server
    finally:
        channel_layers.backends.clear()
        server.stop()


@pytest.fixture(name="session_cookie")
def session_cookie_fixture(client, user, fleet):
    return session_cookie(client, user)


async def _open(path: str, cookie: tuple[bytes, bytes]) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(application, path, headers=[ORIGIN, cookie])
    connected, _ = await ws.connect(timeout=20)
    assert connected
    return ws


@pytest.mark.parametrize(("path", "first"), [("/ws/fleet/", "snapshot"), ("/ws/pending/", "hello")])
@run_async
async def test_websockets_close_cleanly_and_come_back_across_a_redis_restart(
    path, first, session_cookie, private_redis
):
    held = await _open(path, session_cookie)
    assert (await held.receive_json_from(timeout=10))["type"] == first

    private_redis.stop()
    closed = await held.receive_output(timeout=30)
    assert closed["type"] == "websocket.close" and closed["code"] == LAYER_LOST

    during = await _open(path, session_cookie)  # accepted, then closed with a reason: no 500
    refused = await during.receive_output(timeout=30)
    assert refused["type"] == "websocket.close" and refused["code"] == LAYER_UNAVAILABLE

    private_redis.start()
    after = await _open(path, session_cookie)
    assert (await after.receive_json_from(timeout=10))["type"] == first
    await after.disconnect()
