"""A running stream keeps renewing its lease; once its worker stops, the stream reads as stale."""

from __future__ import annotations

import pytest
from django.utils import timezone

from fleet.models import WatchCursor
from tests.controlplane.kube import wait_for

pytestmark = pytest.mark.controlplane


def _cursor() -> WatchCursor:
    return WatchCursor.objects.get(cluster__name="leased", kind="Node")  # waits retry on DoesNotExist


def test_a_running_stream_renews_its_lease_and_is_stale_once_its_worker_stops(
    control_plane, watcher, watch_clusters, settings
):
    settings.CLAIMSCOPE_WATCH_LOCK_TTL = 3  # the lease: renewed every second, lapses 3 s after the worker
    settings.CLAIMSCOPE_WATCH_TIMEOUT = 600  # one long watch: only the heartbeat can move the lease
    watch_clusters({"leased": str(control_plane.kubeconfig)}, kinds=("Node",))
    wait_for("the stream to watch", lambda: _cursor().state == "watching" or None, timeout=30)
    first = _cursor().lease_until
    assert first is not None
    renewed = lambda: (lease := _cursor().lease_until) is not None and lease > first  # noqa: E731
    wait_for("the lease to be renewed", renewed, timeout=10, interval=0.2)
    assert _cursor().status(timezone.now()) == "watching"

    watcher.stop()
    stale = lambda: _cursor().status(timezone.now()) == "stale" or None  # noqa: E731
    wait_for("the stream to read as stale", stale, timeout=20, interval=0.2)
    assert _cursor().state == "watching"  # what the worker last wrote; the lease tells the truth
