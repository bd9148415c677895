"""An object whose resourceVersion equals the stored one is the stored object: ingest leaves it alone.

Kubernetes gives every write a new resourceVersion, so a relist that finds nothing new (after a 410 or a
reconnect) and a watch event delivered twice must write no row, no child, no history and publish no change
event: each change event triggers a diagnosis recompute and summary work.
"""

from contextlib import contextmanager

import pytest

from claims.models import ClaimLifecycle, ClaimStateChange
from fleet import ingest
from fleet.ingest import Change
from fleet.models import Device, DeviceAllocation, Node, ResourceClaim, ResourceSlice
from tests.db.test_ingest import claim_record, node, slice_record, upserts


@pytest.fixture
def cluster():
    return ingest.get_or_create_cluster("unchanged")


@pytest.fixture
def published(monkeypatch, django_capture_on_commit_callbacks):
    """``with published() as events:`` collects the change events of the batches inside (published at
    their commit, which the test transaction only simulates: the callbacks run when the block ends)."""
    events: list[dict] = []
    monkeypatch.setattr(ingest.events, "publish", events.append)

    @contextmanager
    def capture():
        events.clear()
        with django_capture_on_commit_callbacks(execute=True):
            yield events

    return capture


def claims(rv_of_b=11):
    return [
        claim_record("a", 10, devices=[("n1", "gpu-0")]),
        claim_record("b", rv_of_b, devices=[("n1", "gpu-1")] if rv_of_b == 11 else [("n1", "gpu-0")]),
        claim_record("c", 12),  # pending
    ]


def snapshot():
    """Every stored row of the claim tables with its primary key and write stamp: a rewrite changes them."""
    return (
        sorted(ResourceClaim.objects.values_list("pk", "name", "resource_version", "synced_at", "state")),
        sorted(DeviceAllocation.objects.values_list("pk", "claim_uid", "device_name")),
        sorted(ClaimLifecycle.objects.values_list("pk", "uid", "state", "updated_at")),
        sorted(ClaimStateChange.objects.values_list("pk", "uid", "to_state")),
    )


def test_a_relist_of_identical_objects_writes_and_publishes_nothing(cluster, published):
    ingest.replace_all(cluster, "ResourceClaim", claims(), list_resource_version=20)
    before = snapshot()
    with published() as events:
        result = ingest.replace_all(cluster, "ResourceClaim", claims(), list_resource_version=30)

    assert result.written == [] and result.deleted == []
    assert not result.changed
    assert events == []
    assert snapshot() == before  # rows, allocations and history untouched (same pks, same stamps)


def test_a_relist_with_one_changed_object_writes_only_that_one(cluster, published):
    ingest.replace_all(cluster, "ResourceClaim", claims(), list_resource_version=20)
    untouched = sorted(
        DeviceAllocation.objects.filter(claim_uid="uid-a").values_list("pk", "device_name")
    ) + sorted(ResourceClaim.objects.exclude(name="b").values_list("pk", "synced_at"))
    with published() as events:
        result = ingest.replace_all(cluster, "ResourceClaim", claims(rv_of_b=25), list_resource_version=30)

    assert result.written == [("ml", "b")]
    assert events == [ingest.change_event(cluster, result)]
    assert events[0]["kind"] == "ResourceClaim"
    assert (
        sorted(DeviceAllocation.objects.filter(claim_uid="uid-a").values_list("pk", "device_name"))
        + sorted(ResourceClaim.objects.exclude(name="b").values_list("pk", "synced_at"))
        == untouched
    )
    assert list(DeviceAllocation.objects.filter(claim_uid="uid-b").values_list("device_name", flat=True)) == [
        "gpu-0"
    ]


def test_an_equal_version_watch_event_is_a_no_op(cluster, published):
    ingest.apply_batch(cluster, "ResourceClaim", upserts(*claims()))
    before = snapshot()
    with published() as events:
        result = ingest.apply_batch(cluster, "ResourceClaim", upserts(claims()[1]))

    assert result.written == [] and not result.changed
    assert events == []
    assert snapshot() == before


def test_slices_relisted_unchanged_keep_their_devices(cluster, published):
    slices = [slice_record("n1", 5), slice_record("n2", 6)]
    ingest.replace_all(cluster, "ResourceSlice", slices, list_resource_version=10)
    devices = sorted(Device.objects.values_list("pk", "name", "slice_name"))
    stamps = sorted(ResourceSlice.objects.values_list("name", "synced_at"))
    with published() as events:
        result = ingest.replace_all(cluster, "ResourceSlice", slices, list_resource_version=11)

    assert not result.changed and events == []
    assert sorted(Device.objects.values_list("pk", "name", "slice_name")) == devices
    assert sorted(ResourceSlice.objects.values_list("name", "synced_at")) == stamps


def test_a_newer_version_is_still_written_and_an_older_one_still_fenced(cluster):
    ingest.apply_batch(cluster, "Node", upserts(node("n1", 10, ready=True)))
    assert ingest.apply_batch(cluster, "Node", upserts(node("n1", 9, ready=False))).written == []
    assert ingest.apply_batch(cluster, "Node", [Change("upsert", node("n1", 11, ready=False))]).written == [
        ("n1",)
    ]
    assert Node.objects.get(name="n1").ready is False
