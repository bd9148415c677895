"""Ingest against late, duplicate and out-of-date writes: the newer object, its children and its history
are never touched by an older one."""

from __future__ import annotations

import pytest
from django.utils import timezone

from claims.models import ClaimDiagnosis, ClaimLifecycle, DiagnosisShape
from fleet import ingest
from fleet.ingest import Change, CursorUpdate
from fleet.models import DeviceAllocation, ResourceClaim
from tests.db.test_ingest import claim_record, upserts

pytestmark = pytest.mark.django_db


def test_a_stale_event_of_an_old_uid_leaves_the_current_object_alone():
    cluster = ingest.get_or_create_cluster("stale")
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c", 200, [("n1", "gpu-0")], uid="B")))
    # A duplicate worker replays an old event of the name's previous object, with an unrelated write.
    result = ingest.apply_batch(
        cluster, "ResourceClaim", upserts(claim_record("c", 100, uid="A"), claim_record("d", 300))
    )
    assert result.written == [("ml", "d")] and result.stale == 1
    assert ResourceClaim.objects.get(cluster=cluster, name="c").uid == "B"
    assert DeviceAllocation.objects.filter(cluster=cluster, claim_uid="B").count() == 1
    assert ClaimLifecycle.objects.get(cluster=cluster, uid="B").state == "allocated"


def test_a_relist_older_than_a_recreated_object_keeps_the_new_one():
    cluster = ingest.get_or_create_cluster("recreated")
    first = [claim_record("a", 5, [("n1", "gpu-0")]), claim_record("b", 6)]
    ingest.replace_all(cluster, "ResourceClaim", iter(first), 10)
    # A watcher stored "a" deleted and created again (uid A2) at rv 20; then a relist at rv 15 arrives.
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("a", 20, [("n1", "gpu-1")], uid="A2")))
    ingest.replace_all(
        cluster, "ResourceClaim", [claim_record("a", 5, [("n1", "gpu-0")]), claim_record("b", 6)], 15
    )
    assert ResourceClaim.objects.get(cluster=cluster, name="a").uid == "A2"
    held = DeviceAllocation.objects.filter(cluster=cluster, claim_uid="A2")
    assert list(held.values_list("device_name", flat=True)) == ["gpu-1"]
    assert ClaimLifecycle.objects.get(cluster=cluster, uid="A2").state == "allocated"


def test_a_relist_from_a_server_gone_back_in_time_keeps_the_history_of_what_it_still_lists():
    cluster = ingest.get_or_create_cluster("restored")
    ingest.apply_batch(
        cluster, "ResourceClaim", [Change("upsert", claim_record("a", 500))], cursor=CursorUpdate(500)
    )
    ingest.apply_batch(
        cluster, "ResourceClaim", [Change("upsert", claim_record("gone", 501))], cursor=CursorUpdate(501)
    )
    # etcd restored from a backup: the list is at rv 100, still has "a" (same uid), no longer "gone".
    result = ingest.replace_all(cluster, "ResourceClaim", [claim_record("a", 90)], 100)
    assert result.written == [("ml", "a")]
    assert ClaimLifecycle.objects.get(cluster=cluster, uid="uid-a").state == "pending"
    assert ClaimLifecycle.objects.get(cluster=cluster, uid="uid-gone").state == "deleted"


def test_a_claim_recorded_deleted_that_comes_back_is_alive_again():
    cluster = ingest.get_or_create_cluster("back")
    ingest.replace_all(cluster, "ResourceClaim", [claim_record("a", 5)], 10)
    ingest.replace_all(cluster, "ResourceClaim", [], 11)  # skipped once (say, malformed): absent
    assert ClaimLifecycle.objects.get(cluster=cluster, uid="uid-a").state == "deleted"
    ingest.replace_all(cluster, "ResourceClaim", [claim_record("a", 12, [("n1", "gpu-0")])], 13)
    life = ClaimLifecycle.objects.get(cluster=cluster, uid="uid-a")
    assert (life.state, life.deleted_at) == ("allocated", None)


def test_a_relist_reports_only_what_it_deleted():
    cluster = ingest.get_or_create_cluster("counted")
    ingest.replace_all(cluster, "ResourceClaim", [claim_record("a", 5), claim_record("b", 6)], 10)
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("b", 30)))  # newer than the next list
    result = ingest.replace_all(cluster, "ResourceClaim", [], 20)
    assert result.deleted == [("ml", "a")]
    assert list(ResourceClaim.objects.filter(cluster=cluster).values_list("name", flat=True)) == ["b"]


@pytest.mark.django_db(transaction=True)  # the foreign key is checked at commit
def test_a_deleted_event_of_a_diagnosed_claim_commits_and_takes_the_diagnosis_along():
    cluster = ingest.get_or_create_cluster("diagnosed")
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("a", 5)))
    claim = ResourceClaim.objects.get(cluster=cluster, name="a")
    shape = DiagnosisShape.objects.create(
        cluster=cluster, key="k", category="capacity", summary="-", computed_at=timezone.now()
    )
    ClaimDiagnosis.objects.create(claim=claim, shape=shape)
    result = ingest.apply_batch(cluster, "ResourceClaim", [Change("delete", claim_record("a", 6))])
    assert result.deleted == [("ml", "a")]
    assert not ResourceClaim.objects.filter(cluster=cluster).exists()
    assert not ClaimDiagnosis.objects.filter(claim_id=claim.pk).exists()
