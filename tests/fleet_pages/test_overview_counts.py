"""The overview's counts from the per-GPU read model equal the per-device computation they replaced."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import overview, selectors
from fleet.filters import FleetFilter
from fleet.ingest import gpu_state
from fleet.models import Cluster, Device, DeviceAllocation, Node
from fleet.views import _clusters
from tests.fleet_pages.conftest import FIXTURE, FleetEditor


@pytest.fixture(autouse=True)
def _empty_cache():
    cache.clear()
    yield
    cache.clear()


def per_device(filters: FleetFilter) -> list[overview.ClusterOverview]:
    """The previous page code: every current device read and summarized in Python (the oracle)."""
    names = _clusters(filters)
    devices, counter_sets = selectors.heatmap_devices(list(names), model=filters.model, pool=filters.pool)
    labels = selectors.node_labels(list(names)) if filters.label else {}
    devices = overview.narrow(devices, filters, labels)
    holders = selectors.allocation_holders(list(names))
    return overview.cluster_overviews(devices, holders, counter_sets, names)


def test_the_overview_reads_the_read_model_on_every_database_not_the_devices(fleet):
    varied_fleet()
    names = _clusters(FleetFilter())
    with CaptureQueriesContext(connection) as ctx:
        got = overview.compute_overviews(selectors.OverviewScope(tuple(names)), FleetFilter(), names)
    # The read model's versions (what this process's cache compares), then its two aggregates.
    assert len(ctx.captured_queries) == 3
    assert '"fleet_readmodelversion"' in ctx.captured_queries[0]["sql"]
    assert not any('"fleet_device"' in q["sql"] for q in ctx.captured_queries)
    assert shown(got, "") == shown(per_device(FleetFilter()), "")


def shown(clusters: list[overview.ClusterOverview], state: str) -> list[Any]:
    """What the page renders of each cluster."""
    return [(c.name, c.summary.as_dict(), c.groups(state)) for c in clusters]


def varied_fleet() -> None:
    """Two clusters, plus what the fixture lacks: a stale pool generation, a tainted device that is also
    blocked, an adminAccess allocation and an allocation of a claim that is gone."""
    call_command("import_snapshot", str(FIXTURE), cluster="second", stdout=StringIO())
    second = Cluster.objects.get(name="second")
    device = Device.objects.filter(cluster=second, kind="gpu").order_by("pool", "name").first()
    assert device is not None
    stale = Device.objects.get(pk=device.pk)
    stale.pk, stale.name, stale.pool_generation = None, "stale-gpu", device.pool_generation - 1
    stale.save()
    Device.objects.filter(cluster=second, kind="mig").exclude(counters_consumed=[]).filter(
        pk__in=Device.objects.filter(cluster=second, kind="mig")
        .exclude(counters_consumed=[])
        .values("pk")[:5]
    ).update(tainted=True)
    free = Device.objects.filter(cluster=second, kind="gpu", counters_consumed=[]).order_by("name")
    for claim_uid, admin, d in (("gone", False, free[0]), ("admin", True, free[1])):
        DeviceAllocation.objects.create(
            cluster=second, claim_uid=claim_uid, request="r", driver=d.driver, pool=d.pool,
            device_name=d.name, admin_access=admin,
        )  # fmt: skip
    Node.objects.filter(cluster=second, name__startswith="b200").update(labels={"zone": "a"})
    # A tainted device in use: counted tainted and reserved, not unavailable.
    holders = selectors.allocation_holders([second.pk])
    in_use = [k for k, held in holders.items() if any(h.state == "reserved" for h in held)]
    cid, driver, pool, name = sorted(in_use)[0]
    Device.objects.filter(cluster_id=cid, driver=driver, pool=pool, name=name).update(tainted=True)
    # The rows above were written around ingest: recompute the read model as ingest would have.
    gpu_state.refresh(second.pk)


FILTERS = [
    FleetFilter(),
    FleetFilter(model="B200"),
    FleetFilter(model="H100"),
    FleetFilter(pool="h100-d1"),
    FleetFilter(label="zone"),
    FleetFilter(label="zone=b"),
    FleetFilter(cluster="second"),
    *(FleetFilter(state=s) for s in ("free", "allocated", "reserved", "tainted", "unavailable")),
]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: f.query() or "all")
def test_the_overview_counts_equal_the_per_device_computation(fleet, filters):
    varied_fleet()
    expected = shown(per_device(filters), filters.state)
    got = shown(overview.load_cluster_overviews(filters, _clusters(filters)), filters.state)
    assert got == expected


def test_the_varied_fleet_has_every_state_the_counts_split(fleet):
    # Guards the test above: the fleet it compares on has a device in each state and MIG on both kinds.
    varied_fleet()
    groups = [g for c in per_device(FleetFilter()) for g in c.groups()]
    for state in ("free", "reserved", "allocated", "tainted", "unavailable"):
        assert any(g[state] for g in groups), state
    models = [m for c in per_device(FleetFilter()) for m in c.summary.models]
    for count in ("gpus_full", "gpus_static_mig", "gpus_dynamic", "gpus_whole_allocated", "gpus_tainted"):
        assert any(getattr(m, count) for m in models), count
    held = selectors.allocation_holders(None)
    tainted = Device.objects.filter(tainted=True).values_list("cluster_id", "driver", "pool", "name")
    assert any(tuple(k) in held for k in tainted), "a tainted device in use"


CHANGES = {
    "deallocate": lambda e: e.deallocate(e.allocated_claims()[0]),
    "delete a claim": lambda e: e.delete("ResourceClaim", e.allocated_claims()[0]),
    "taint": lambda e: [e.taint_devices(s, len(s["spec"]["devices"])) for s in e.gpu_slices()],
}


@pytest.mark.parametrize("change", CHANGES)
def test_the_overview_follows_every_committed_change_at_once(fleet, change, monkeypatch):
    names = _clusters(FleetFilter())
    before = overview.load_cluster_overviews(FleetFilter(), names)
    # The change commits with a synced_at older than the newest row's, as a batch that stamped before
    # another stream's batch but committed after it: neither a count nor the newest synced_at moves.
    past = timezone.now() - timedelta(hours=1)
    monkeypatch.setattr(timezone, "now", lambda: past)
    CHANGES[change](FleetEditor())
    monkeypatch.undo()
    after = overview.load_cluster_overviews(FleetFilter(), _clusters(FleetFilter()))
    assert shown(after, "") == shown(per_device(FleetFilter()), "") != shown(before, "")
