"""REST API tests: real PostgreSQL, data from the fixtures and from the simulator, through ingest."""

from __future__ import annotations

import functools
import threading
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import call_command
from rest_framework.test import APIClient

from fleet import ingest
from fleet.access.visibility import grant_all_namespaces
from fleet.importer import INGEST_ORDER
from fleet.kube.reflector import Reflector, StreamConfig
from tests.databases import require_expected_backend

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml"


@pytest.fixture(autouse=True)
def _require_expected_backend(db):
    require_expected_backend("API")


@pytest.fixture(autouse=True)
def _fresh_throttles():
    # Throttle counters live in the cache (Redis): one test's requests must not throttle the next test.
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def user():
    # Sees every namespace: these suites are not about visibility (tests/security/ is).
    user = get_user_model().objects.create_user("alice", password="correct horse battery staple")
    grant_all_namespaces(user)
    return user


@pytest.fixture
def api(user):
    """A client logged in with a session, as a browser would be."""
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def token(user):
    """A new API token's key (as shown once on the token page)."""
    from fleet.api.tokens import create_token

    return create_token(user)


@pytest.fixture
def fixture_fleet():
    call_command("import_snapshot", str(FIXTURE), cluster="fixtures", stdout=StringIO())


@functools.cache
def _monday():
    """The monday scenario at Monday 09:00 (the weekend played by the simulator); read-only afterwards."""
    from simulator import scenarios

    simulation = scenarios.monday_simulation(0)
    simulation.run(scenarios.MONDAY_09)
    return simulation


@pytest.fixture
def sim_fleet():
    """The simulated monday fleet, mirrored into cluster "sim" by the reflector (list + one short watch per
    kind), the way workers mirror a real cluster."""
    cluster = ingest.get_or_create_cluster("sim", "simulated monday fleet")
    config = StreamConfig(
        flush_interval=0.05, watch_timeout=0.1, idle_timeout=5, backoff_min=0.01, backoff_max=0.02
    )
    for kind in INGEST_ORDER:
        Reflector(cluster, kind, _monday().cluster, config).run(threading.Event(), max_watches=1)
    return cluster


def results(response):
    assert response.status_code == 200, response.content[:500]
    return response.json()["results"]


def all_rows(client, url, **params):
    """Every row of a list endpoint, following the cursor."""
    rows, next_url = [], url
    response = client.get(url, {"page_size": 1000, **params})
    while True:
        assert response.status_code == 200, response.content[:500]
        body = response.json()
        rows += body["results"]
        next_url = body["next"]
        if not next_url:
            return rows
        response = client.get(next_url)
