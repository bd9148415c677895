"""Concurrent batches of different kinds on one pool leave the per-GPU read model current."""

import threading

import pytest
from django.db import connection, transaction

from fleet import ingest, selectors
from fleet.models import GpuState, ReadModelVersion
from tests.db.test_ingest import claim_record, slice_record, upserts


@pytest.mark.django_db(transaction=True)
def test_a_claim_batch_racing_a_slice_batch_of_its_pool_leaves_the_read_model_current(monkeypatch):
    monkeypatch.setattr(ingest.events, "_notify", lambda event: None)  # no listeners outlive the test
    cluster = ingest.get_or_create_cluster("race")
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 1, gpus=2)))
    written, release = threading.Event(), threading.Event()

    def taint_slice_uncommitted() -> None:
        # A new slice version of the pool, written but not committed while the claim batch runs.
        try:
            with transaction.atomic():
                record = slice_record("n1", 5, gpus=2)
                for device in record.devices:
                    device.taints.append({"key": "xid", "value": "79", "effect": "NoSchedule"})
                ingest.apply_batch(cluster, "ResourceSlice", upserts(record))
                written.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=taint_slice_uncommitted)
    thread.start()
    claim_thread = None
    try:
        assert written.wait(10)

        def allocate() -> None:
            try:
                ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c", 2, [("n1", "gpu-0")])))
            finally:
                connection.close()

        claim_thread = threading.Thread(target=allocate)
        claim_thread.start()
        claim_thread.join(1)  # waits for the slice batch's read-model lock
        release.set()
        claim_thread.join(10)
        assert not claim_thread.is_alive()
    finally:
        release.set()
        thread.join(10)
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
    written, release = threading.Event(), threading.Event()

    def rule_uncommitted() -> None:
        # The rule, written (and the stored devices re-tainted) but not committed while the slice batch runs.
        try:
            with transaction.atomic():
                ingest.apply_batch(
                    cluster, "DeviceTaintRule", upserts(normalize("DeviceTaintRule", rule_obj))
                )
                written.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=rule_uncommitted)
    thread.start()
    slice_thread = None
    try:
        assert written.wait(10)

        def republish() -> None:
            # A new version of the pool's slice: its device rows are written with their own taints only.
            try:
                ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 5, gpus=2)))
            finally:
                connection.close()

        slice_thread = threading.Thread(target=republish)
        slice_thread.start()
        slice_thread.join(1)  # waits for the rule batch's read-model lock
        release.set()
        slice_thread.join(10)
        assert not slice_thread.is_alive()
    finally:
        release.set()
        thread.join(10)
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
    written, release = threading.Event(), threading.Event()

    def slices_uncommitted() -> None:
        try:
            with transaction.atomic():
                ingest.replace_all(cluster, "ResourceSlice", [slice_record("n1", 1, gpus=2)], 1)
                written.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=slices_uncommitted)
    thread.start()
    claim_thread = None
    try:
        assert written.wait(10)

        def list_claims() -> None:
            try:
                ingest.replace_all(cluster, "ResourceClaim", [claim_record("c", 2, [("n1", "gpu-0")])], 2)
            finally:
                connection.close()

        claim_thread = threading.Thread(target=list_claims)
        claim_thread.start()
        claim_thread.join(1)
        assert claim_thread.is_alive(), "waits for the slices' list to commit"
        release.set()
        claim_thread.join(10)
        assert not claim_thread.is_alive()
    finally:
        release.set()
        thread.join(10)
    gpus = GpuState.objects.filter(cluster=cluster)
    assert gpus.count() == 2, "the slices' GPUs"
    assert sum(g.whole_allocated for g in gpus) == 1, "the claims' allocation"
    assert not ReadModelVersion.objects.filter(cluster=cluster, owed=True).exists()
    assert selectors.fleet_summary().as_dict() == selectors.fleet_summary_per_device().as_dict()
