"""Concurrent batches of different kinds on one pool leave the per-GPU read model current."""

import threading

import pytest
from django.db import connection, transaction

from fleet import ingest, selectors
from fleet.models import GpuState
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
