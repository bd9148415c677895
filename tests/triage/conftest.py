"""The monday scenario replayed into PostgreSQL once per module, committed (pages are served from another
thread, which sees only committed rows), and removed afterwards."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from claims.models import ClaimLifecycle, ClaimStateChange, PendingCause
from fleet import ingest
from fleet.models import AllocationSample, Cluster
from tests.browser.conftest import browser, chromium_path, page  # noqa: F401  (the browser fixtures)
from tests.databases import require_expected_backend
from tests.triage import replay

PASSWORD = "correct horse battery staple"


@functools.cache
def played() -> replay.Played:
    """The weekend, played once per test session (deterministic; read-only afterwards)."""
    return replay.play(0)


def _clean() -> None:
    Cluster.objects.filter(name=replay.CLUSTER).delete()  # cascades to every mirrored and history row
    for model in (ClaimLifecycle, ClaimStateChange, PendingCause, AllocationSample):
        model.objects.all().delete()
    get_user_model().objects.filter(username__in=["oncall", "inference-dev"]).delete()


@pytest.fixture(scope="module")
def monday(django_db_setup, django_db_blocker):
    """The replayed weekend (cluster "monday") with an on-call superuser and an inference-only user."""
    with django_db_blocker.unblock():
        require_expected_backend("triage")
        _clean()
        with pytest.MonkeyPatch.context() as mp:
            # Nobody consumes the change events or the debounced diagnosis here: the replay runs the
            # diagnosis itself on the simulated clock.
            mp.setattr(ingest.events, "publish", lambda event: None)
            mp.setattr(ingest.events, "_listeners", [])
            cluster = replay.replay(played(), diagnose_every=timedelta(hours=1))
        users = get_user_model().objects
        users.create_superuser("oncall", password=PASSWORD)
        dev = users.create_user("inference-dev", password=PASSWORD)
        from fleet.models import NamespaceGrant

        NamespaceGrant.objects.create(user=dev, cluster=cluster, namespace="inference")
        yield cluster
        _clean()
