"""A stream's state tells the truth: stale once no worker has vouched for it within its lease.

The state a worker last wrote ("watching") outlives the worker; the lease (``WatchCursor.lease_until``,
pushed forward by the running round's heartbeat) does not. ``clusters``, the overview, the API and the
health endpoints all read it through ``fleet.models.stream_status``.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from fleet import ingest
from fleet.models import WatchCursor


@pytest.fixture
def streams_of_a_dead_and_a_live_worker(monkeypatch):
    monkeypatch.setenv("CLAIMSCOPE_CLUSTERS", "")
    cluster = ingest.get_or_create_cluster("prod")
    now = timezone.now()
    WatchCursor.objects.create(
        cluster=cluster, kind="Node", state="watching", lease_until=now + timedelta(seconds=30)
    )
    WatchCursor.objects.create(
        cluster=cluster, kind="Pod", state="watching", lease_until=now - timedelta(seconds=1)
    )
    WatchCursor.objects.create(cluster=cluster, kind="Event", state="watching", lease_until=None)
    return cluster


def test_clusters_shows_a_stream_whose_lease_lapsed_as_stale(streams_of_a_dead_and_a_live_worker):
    out = StringIO()
    call_command("clusters", stdout=out)
    rows = {line.split()[1]: line for line in out.getvalue().splitlines() if line.startswith("prod ")}
    assert "stale (watching)" in rows["Pod"]
    assert "stale (watching)" in rows["Event"]
    assert "stale" not in rows["Node"] and "watching" in rows["Node"]


def test_the_api_reports_the_status_now_beside_the_state_last_written(
    api, streams_of_a_dead_and_a_live_worker
):
    body = api.get("/api/v1/streams/").json()
    by_kind = {row["kind"]: row for row in body["results"]}
    assert {k: (r["state"], r["status"]) for k, r in by_kind.items()} == {
        "Node": ("watching", "watching"),
        "Pod": ("watching", "stale"),
        "Event": ("watching", "stale"),
    }


def test_the_overview_names_the_stale_streams(api, streams_of_a_dead_and_a_live_worker):
    page = api.get("/fleet/").content.decode()
    alert = page[page.index('id="stream-alert"') :].split("</div>")[0]
    assert "prod/Pod" in alert and "prod/Event" in alert and "prod/Node" not in alert


def test_healthz_reports_stale_streams_and_stays_up(client, streams_of_a_dead_and_a_live_worker):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "degraded",
        "database": "ok",
        # The embedded default (SQLite, in-memory layer) has no Redis to report on.
        "redis": "ok" if settings.REDIS_URL else "not configured",
        "streams": {"total": 3, "stale": 2},
    }


def test_readyz_is_ready_with_stale_streams_while_the_database_and_redis_answer(
    client, streams_of_a_dead_and_a_live_worker
):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "degraded"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def test_readyz_refuses_while_redis_is_unreachable(client):
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{_closed_port()}/0"):
        response = client.get("/readyz")
        live = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["redis"] == "ConnectionError"
    assert response.json()["status"] == "error"
    assert live.status_code == 200  # liveness: restarting the web process would not bring Redis back
