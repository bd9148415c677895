"""Logging out ends the session for websockets too: through a real ASGI server (uvicorn), the Redis channel
layer, a real websocket client and the login/logout pages."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
import requests
from django.conf import settings
from django.db import connection
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from dashboard.routing import websocket_urlpatterns
from fleet.consumers import UNAUTHORIZED
from tests.fleet_pages.server import asgi_server
from tests.security.conftest import PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(viewer):
    # The layer this configuration runs: Redis in production, the in-memory one of the embedded default.
    layer = str(settings.CHANNEL_LAYERS["default"]["BACKEND"])
    expected = "RedisChannelLayer" if connection.vendor == "postgresql" else "channels.layers.InMemory"
    if expected not in layer:
        pytest.fail(f"the logout test expected the {expected} channel layer, got {layer} (run `make test`)")
    with asgi_server() as base:
        yield base
    if connection.vendor != "postgresql":
        return
    # The server's worker threads keep database connections: end them, or the test database cannot go.
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def log_in(base: str, username: str) -> requests.Session:
    """Log in through the login page, as a browser does (CSRF cookie and token)."""
    session = requests.Session()
    session.get(f"{base}/accounts/login/", timeout=10).raise_for_status()
    answer = session.post(
        f"{base}/accounts/login/",
        data={
            "username": username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        timeout=10,
    )
    answer.raise_for_status()
    assert settings.SESSION_COOKIE_NAME in session.cookies, "login failed"
    return session


def session_cookie(session: requests.Session) -> str:
    return str(session.cookies[settings.SESSION_COOKIE_NAME])


def ws_routes() -> list[str]:
    """Every websocket route of the app (dashboard/routing.py): each must close on logout."""
    return ["/" + str(p.pattern) for p in websocket_urlpatterns if str(p.pattern)]  # not the catch-all


def open_socket(base: str, session_cookie: str, route: str = "/ws/fleet/") -> ClientConnection:
    return connect(
        base.replace("http://", "ws://") + route,
        additional_headers={
            "Cookie": f"{settings.SESSION_COOKIE_NAME}={session_cookie}",
            "Origin": base,
        },
        open_timeout=10,
    )


def close_code(ws: ClientConnection) -> int | None:
    """Read until the server closes the socket (a delta may still be in flight); its close code."""
    try:
        while True:
            ws.recv(timeout=10)
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


def test_logging_out_closes_the_sessions_websockets_and_the_old_cookie_is_refused(server, viewer) -> None:
    routes = ws_routes()
    assert "/ws/fleet/" in routes
    browser = log_in(server, viewer.username)
    cookie = session_cookie(browser)
    other = log_in(server, viewer.username)  # another session of the same user (another browser)
    with ExitStack() as stack:
        # Two sockets on the fleet feed and one on every other route, all with the session that logs out.
        mine = [stack.enter_context(open_socket(server, cookie, route)) for route in ["/ws/fleet/", *routes]]
        bystander = stack.enter_context(open_socket(server, session_cookie(other)))
        for ws in [*mine, bystander]:
            ws.recv(timeout=10)  # the first message (snapshot, hello): the socket is live

        answer = browser.post(
            f"{server}/accounts/logout/",
            headers={"X-CSRFToken": str(browser.cookies["csrftoken"])},
            timeout=10,
            allow_redirects=False,
        )
        assert answer.status_code in (200, 302)

        assert [close_code(ws) for ws in mine] == [UNAUTHORIZED] * len(mine)
        for route in routes:
            with pytest.raises(InvalidStatus) as refused:
                open_socket(server, cookie, route)
            assert refused.value.response.status_code == 403, route
        # Only the session that logged out ended: the other one streams on.
        assert bystander.ping().wait(10)
