"""Concurrent batches of different kinds on one pool leave the per-GPU read model current."""

import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from fleet import ingest, selectors
from fleet.models import GpuState, ReadModelVersion
from tests.db.test_ingest import claim_record, slice_record, upserts


def second_behind_first(first: Callable[[], object], second: Callable[[], object]) -> bool:
    """Run ``first`` in a thread's transaction left uncommitted, then ``second`` in another thread, and
    commit ``first`` after a second; returns whether ``second`` was still running then (waiting for
    ``first``'s locks). Both threads end before it returns."""
    written, release = threading.Event(), threading.Event()

    def in_thread(fn: Callable[[], object], hold: bool) -> Callable[[], None]:
        def run() -> None:
            try:
                with transaction.atomic():
                    fn()
                    if hold:
                        written.set()
                        release.wait(10)
            finally:
                connection.close()

        return run

    thread = threading.Thread(target=in_thread(first, hold=True))
    thread.start()
    try:
        assert written.wait(10)
        second_thread = threading.Thread(target=in_thread(second, hold=False))
        second_thread.start()
        second_thread.join(1)
        waited = second_thread.is_alive()
        release.set()
        second_thread.join(10)
        assert not second_thread.is_alive()
    finally:
        release.set()
        thread.join(10)
    return waited


@pytest.mark.django_db(transaction=True)
def test_a_claim_batch_racing_a_slice_batch_of_its_pool_leaves_the_read_model_current(monkeypatch):
    monkeypatch.setattr(ingest.events, "_notify", lambda event: None)  # no listeners outlive the test
    cluster = ingest.get_or_create_cluster("race")
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 1, gpus=2)))

    def taint_slice() -> None:  # a new slice version of the pool, uncommitted while the claim batch runs
        record = slice_record("n1", 5, gpus=2)
        for device in record.devices:
            device.taints.append({"key": "xid", "value": "79", "effect": "NoSchedule"})
        ingest.apply_batch(cluster, "ResourceSlice", upserts(record))

    def allocate() -> None:  # waits for the slice batch's read-model lock
        ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c", 2, [("n1", "gpu-0")])))

    second_behind_first(taint_slice, allocate)
    gpus = {g.gpu_uuid: g for g in GpuState.objects.filter(cluster=cluster)}
    assert all(g.tainted for g in gpus.values()), "the slice batch's taints"
    assert sum(g.whole_allocated for g in gpus.values()) == 1, "the claim batch's allocation"
    assert selectors.fleet_summary().as_dict() == selectors.fleet_summary_per_device().as_dict()


@pytest.mark.django_db(transaction=True)
def test_a_slice_batch_racing_a_device_taint_rule_batch_of_its_pool_gets_the_rules_taint(monkeypatch):
    from fleet.models import Device
    from fleet.normalize import normalize
    from simulator import nvidia

    monkeypatch.setattr(ingest.events, "_notify", lambda event: None)
    cluster = ingest.get_or_create_cluster("rule-race")
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 1, gpus=2)))
    rule_obj = nvidia.device_taint_rule("drain-n1", {"key": "maintenance", "effect": "NoSchedule"}, pool="n1")
    rule_obj["metadata"]["resourceVersion"] = "3"

    def add_rule() -> None:  # the rule, written (the stored devices re-tainted) but not committed
        ingest.apply_batch(cluster, "DeviceTaintRule", upserts(normalize("DeviceTaintRule", rule_obj)))

    def republish() -> None:  # a new slice version: its device rows carry their own taints only
        ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 5, gpus=2)))

    second_behind_first(add_rule, republish)  # the slice batch waits for the rule batch's read-model lock
    assert set(Device.objects.filter(cluster=cluster).values_list("tainted", flat=True)) == {True}
    assert all(g.tainted for g in GpuState.objects.filter(cluster=cluster))
    assert selectors.fleet_summary().as_dict() == selectors.fleet_summary_per_device().as_dict()


@pytest.mark.django_db(transaction=True)
def test_two_first_lists_committing_together_leave_one_whole_recompute_with_both(monkeypatch):
    # The slices' first list finds the claims' still running and leaves the recompute to it; it has not
    # committed when the claims' list reaches its recompute. That one must wait for it (the read model's
    # lock), then see it listed and recompute the whole cluster, the slices' rows included: deciding
    # before the lock, it would see the slices still listing and leave the recompute to nobody.
    monkeypatch.setattr(ingest.events, "_notify", lambda event: None)
    cluster = ingest.get_or_create_cluster("first-lists-race")
    for kind in ("ResourceSlice", "ResourceClaim"):
        ingest.cursors.save_state(cluster, kind, "listing", "", 60)

    def list_slices() -> None:
        ingest.replace_all(cluster, "ResourceSlice", [slice_record("n1", 1, gpus=2)], 1)

    def list_claims() -> None:
        ingest.replace_all(cluster, "ResourceClaim", [claim_record("c", 2, [("n1", "gpu-0")])], 2)

    assert second_behind_first(list_slices, list_claims), "waits for the slices' list to commit"
    gpus = GpuState.objects.filter(cluster=cluster)
    assert gpus.count() == 2, "the slices' GPUs"
    assert sum(g.whole_allocated for g in gpus) == 1, "the claims' allocation"
    assert not ReadModelVersion.objects.filter(cluster=cluster, owed=True).exists()
    assert selectors.fleet_summary().as_dict() == selectors.fleet_summary_per_device().as_dict()
