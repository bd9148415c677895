"""Pending page tests: real PostgreSQL, the simulated monday weekend mirrored through ingest and diagnosed
by the same task the workers run."""

from __future__ import annotations

import functools
import threading

import pytest
from django.contrib.auth import get_user_model

from claims.tasks import recompute_diagnoses
from fleet import ingest
from fleet.access.visibility import grant_all_namespaces
from fleet.importer import INGEST_ORDER
from fleet.kube.reflector import Reflector, StreamConfig
from tests.browser.conftest import browser, chromium_path, page  # noqa: F401  (Chromium fixtures)
from tests.databases import require_expected_backend

PASSWORD = "correct horse battery staple"
CLUSTER = "sim"


@pytest.fixture(autouse=True)
def _require_expected_backend(db):
    require_expected_backend("pending page")


@functools.cache
def monday_simulation():
    """The monday scenario played to Monday 09:00 with the allocator replay as the scheduler (so pending
    claims are exactly the ones the real scheduler would leave pending); read-only afterwards."""
    from simulator import scenarios
    from simulator.scheduling_allocator import allocator_schedule

    simulation = scenarios.monday_simulation(0, schedule=allocator_schedule)
    simulation.run(scenarios.MONDAY_09)
    return simulation


def load_monday(monkeypatch) -> None:
    """Mirror the monday fleet into cluster "sim" with the reflector (list + one short watch per kind),
    then diagnose it with ``recompute_diagnoses`` called directly (the debounced trigger is switched off
    while loading: one recomputation at the end is what the workers would converge to)."""
    cluster = ingest.get_or_create_cluster(CLUSTER, "simulated monday fleet")
    config = StreamConfig(
        flush_interval=0.05, watch_timeout=0.1, idle_timeout=5, backoff_min=0.01, backoff_max=0.02
    )
    with monkeypatch.context() as patch:
        patch.setattr(ingest.events, "_listeners", [])
        for kind in INGEST_ORDER:
            Reflector(cluster, kind, monday_simulation().cluster, config).run(
                threading.Event(), max_watches=1
            )
    recompute_diagnoses(CLUSTER)


@pytest.fixture
def monday(monkeypatch):
    load_monday(monkeypatch)
    return CLUSTER


@pytest.fixture
def admin_user():
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    grant_all_namespaces(user)
    return user


@pytest.fixture
def signed_in(client, admin_user):
    client.force_login(admin_user)
    return client
