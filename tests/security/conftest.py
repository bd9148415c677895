"""Security tests: namespace visibility, websocket logout, OIDC login. On the real PostgreSQL.

The visibility fixture: the small fixture fleet (cluster ``fixtures``) and a user granted one namespace,
``research`` (allocated, pending and diagnosed claims, pods, events). Every other namespace (``ml-train``,
``inference``, ``gpu-admin``) is foreign to that user.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from claims import tasks
from fleet import ingest
from fleet.models import NamespaceGrant, Pod, ResourceClaim, SchedulingEvent
from tests.databases import require_expected_backend

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml"
CLUSTER = "fixtures"
GRANTED = "research"
PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _require_expected_backend(db):
    require_expected_backend("security")


@pytest.fixture
def fleet():
    call_command("import_snapshot", str(FIXTURE), cluster=CLUSTER, stdout=StringIO())
    return ingest.get_or_create_cluster(CLUSTER)


@pytest.fixture
def viewer(fleet):
    """A user who may see the ``research`` namespace of cluster ``fixtures`` only."""
    user = get_user_model().objects.create_user("rita", password=PASSWORD)
    NamespaceGrant.objects.create(user=user, cluster=fleet, namespace=GRANTED)
    return user


@pytest.fixture
def diagnosed(fleet):
    """Stored diagnoses for the pending claims: their summaries name the claims holding devices."""
    tasks.recompute_diagnoses(CLUSTER)


@pytest.fixture
def viewer_client(client, viewer, diagnosed):
    client.force_login(viewer)
    return client


@dataclass(frozen=True)
class Names:
    """Identities of claims, pods and events, split by whether the viewer may see them."""

    visible_claims: frozenset[str]
    visible_pods: frozenset[str]
    foreign: frozenset[str]  # claim, pod and event names and the namespaces themselves

    def leaks(self, text: str) -> list[str]:
        """The foreign identities that appear in ``text`` as whole names."""
        return sorted(n for n in self.foreign if _word(n).search(text))

    def shown(self, text: str, names: Iterable[str]) -> list[str]:
        return sorted(n for n in names if _word(n).search(text))


def _word(name: str) -> re.Pattern[str]:
    # A whole name: not glued to other name characters ("eval-0" must not match "eval-0-gpu-n465x"'s
    # visible cousin, nor a longer word). A name inside "ns/name", a URL or JSON still matches.
    return re.compile(rf"(?<![A-Za-z0-9-]){re.escape(name)}(?![A-Za-z0-9-])")


@pytest.fixture
def names(fleet) -> Names:
    claims = list(ResourceClaim.objects.values_list("namespace", "name"))
    pods = list(Pod.objects.values_list("namespace", "name"))
    events = list(SchedulingEvent.objects.values_list("namespace", "name"))
    foreign = {n for ns, n in [*claims, *pods, *events] if ns != GRANTED}
    foreign |= {ns for ns, _ in [*claims, *pods, *events] if ns != GRANTED}
    names = Names(
        visible_claims=frozenset(n for ns, n in claims if ns == GRANTED),
        visible_pods=frozenset(n for ns, n in pods if ns == GRANTED),
        foreign=frozenset(foreign),
    )
    # The fixture must give the test something to find on both sides.
    assert len(names.visible_claims) >= 3 and len(names.foreign) >= 20
    return names
