"""A real ASGI server (uvicorn) in a thread of the test process, for websocket browser tests.

pytest-django's ``live_server`` is WSGI-only. Running uvicorn in this process means it uses the test
database settings and the same channel layer configuration as the code the test drives through ingest.
Static files are served from the finders (as ``runserver`` would), with no collectstatic.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def asgi_server(port: int | None = None) -> Iterator[str]:
    """Serve dashboard.asgi.application on 127.0.0.1 (on ``port``, or a free one); yields the base URL;
    stops on exit, closing open websockets."""
    from channels.routing import ProtocolTypeRouter

    from dashboard.asgi import application

    # Static files for HTTP; websockets go straight to the Channels stack.
    app = ProtocolTypeRouter(
        {
            "http": ASGIStaticFilesHandler(application.application_mapping["http"]),
            "websocket": application.application_mapping["websocket"],
        }
    )
    port = port or free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        ws="websockets-sansio",
        proxy_headers=False,  # as deployed: the app decides which forwarded headers to believe
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="asgi-test-server", daemon=True)
    thread.start()
    started = threading.Event()

    def wait_started() -> None:
        while not server.started and thread.is_alive():
            started.wait(0.02)

    wait_started()
    if not server.started:
        raise RuntimeError("the test ASGI server did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
