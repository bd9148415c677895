"""Fleet page, feed and websocket tests: on the real PostgreSQL, with the small fixture fleet."""

from __future__ import annotations

import copy
import itertools
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from fleet import ingest
from fleet.access.visibility import grant_all_namespaces
from fleet.ingest import Change
from fleet.normalize import normalize
from fleet.snapshot import by_kind, read_files
from tests.databases import require_expected_backend

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml"
FIXTURE_GPUS = 48  # physical GPUs in fleet-small.yaml (EXPECTED.json: 112+56+112+56 compute slices / 7)
PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _require_expected_backend(db):
    require_expected_backend("fleet page")


@pytest.fixture(autouse=True)
def _fresh_heatmap_cache():
    # The process-wide GPU cache outlives a test's database rows; every test starts from an empty one.
    from fleet import feed

    feed.CACHE.clear()
    yield
    feed.CACHE.clear()


@pytest.fixture
def user():
    # Sees every namespace: these suites are not about visibility (tests/security/ is).
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    grant_all_namespaces(user)
    return user


@pytest.fixture
def fleet():
    call_command("import_snapshot", str(FIXTURE), cluster="fixtures", stdout=StringIO())
    return ingest.get_or_create_cluster("fixtures")


@pytest.fixture
def signed_in(client, user, fleet):
    client.force_login(user)
    return client


class FleetEditor:
    """Changes the imported fixture fleet through ingest, the way a watch stream would."""

    def __init__(self, cluster_name: str = "fixtures") -> None:
        self.cluster = ingest.get_or_create_cluster(cluster_name)
        self.objects, _ = by_kind(read_files([FIXTURE]))
        self.rv = itertools.count(10_000_000)

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        return obj

    def upsert(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = self._bump(obj)
        ingest.apply_batch(self.cluster, kind, [Change("upsert", normalize(kind, obj))])
        return obj

    def delete(self, kind: str, obj: dict[str, Any]) -> None:
        ingest.apply_batch(self.cluster, kind, [Change("delete", normalize(kind, self._bump(obj)))])

    def gpu_slices(self) -> list[dict[str, Any]]:
        slices = self.objects["ResourceSlice"]
        return [s for s in slices if s["spec"].get("driver") == "gpu.nvidia.com" and s["spec"].get("devices")]

    def taint_devices(self, slice_obj: dict[str, Any], count: int, on: bool = True) -> dict[str, Any]:
        """Taint (or untaint) the first ``count`` devices of a slice; returns the new slice object."""
        obj = copy.deepcopy(slice_obj)
        for device in obj["spec"]["devices"][:count]:
            if on:
                device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
            else:
                device.pop("taints", None)
        return self.upsert("ResourceSlice", obj)

    def taint_rule(
        self, name: str, selector: dict[str, str] | None, effect: str = "NoSchedule"
    ) -> dict[str, Any]:
        """Create (or change) a DeviceTaintRule; returns it."""
        spec: dict[str, Any] = {"taint": {"key": "example.com/maintenance", "value": name, "effect": effect}}
        if selector is not None:
            spec["deviceSelector"] = selector
        rule = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": name, "uid": f"rule-{name}"},
            "spec": spec,
        }
        return self.upsert("DeviceTaintRule", rule)

    def deallocate(self, claim: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(claim)
        obj.pop("status", None)
        return self.upsert("ResourceClaim", obj)

    def allocated_claims(self) -> list[dict[str, Any]]:
        return [c for c in self.objects["ResourceClaim"] if (c.get("status") or {}).get("allocation")]


@pytest.fixture
def editor(fleet):
    return FleetEditor()
