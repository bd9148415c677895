"""Fixtures for the watcher tests: the real control plane(s), in-process streams, the stream settings.

The control-plane fixtures come from tests/controlplane/fixtures.py (loaded by the root conftest.py);
a second control plane is started for the two-cluster test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from fleet import clusters
from fleet.kube import foreground, streams
from tests.controlplane.launcher import ControlPlane, ControlPlaneError


@pytest.fixture(autouse=True)
def _require_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.fail(f"watcher tests need PostgreSQL (set DATABASE_URL), got {connection.vendor}")


@pytest.fixture(autouse=True)
def _fast_streams(settings: object) -> Iterator[None]:
    """Short server-side watch timeouts (rounds end and resume often) and quick retries."""
    settings.CLAIMSCOPE_WATCH_TIMEOUT = 8  # type: ignore[attr-defined]
    settings.CLAIMSCOPE_WATCH_BACKOFF_MAX = 2  # type: ignore[attr-defined]
    settings.CLAIMSCOPE_WATCH_FORBIDDEN_RETRY = 2  # type: ignore[attr-defined]
    streams._sources.clear()
    yield
    streams._sources.clear()


@pytest.fixture(scope="session")
def second_control_plane() -> Iterator[ControlPlane]:
    cp = ControlPlane()
    try:
        cp.__enter__()
    except ControlPlaneError as err:
        pytest.fail(f"the second control plane did not start:\n{err}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()
        cp.cleanup()


class Streams:
    """Runs every stream of the configured clusters in threads, exactly as `manage.py watch` does
    (unlocked, as without Redis); ``stop()`` ends them (also done after the test)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, configs: dict[str, str], kinds: tuple[str, ...] = streams.STREAM_KINDS) -> None:
        """``configs``: {cluster name: kubeconfig path}, set as CLAIMSCOPE_CLUSTERS."""
        value = ",".join(f"{name}=kubeconfig:{path}" for name, path in configs.items())
        self.monkeypatch.setenv(clusters.ENV, value)
        self.stop_event = threading.Event()
        self.threads = foreground.start(clusters.configured(), kinds, self.stop_event, use_lock=False)

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(15)
        assert not any(t.is_alive() for t in self.threads), "a stream thread did not stop"
        streams._sources.clear()


@pytest.fixture
def watcher(transactional_db: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Streams]:
    runner = Streams(monkeypatch)
    yield runner
    runner.stop()


@pytest.fixture
def watch_clusters(watcher: Streams) -> Callable[..., None]:
    """Start the streams of {name: kubeconfig path} (optionally only ``kinds``) until the test ends."""
    return watcher.start
