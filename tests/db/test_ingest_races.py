"""Ingest against late, duplicate and out-of-date writes: the newer object, its children and its history
are never touched by an older one."""

from __future__ import annotations

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from claims.models import ClaimDiagnosis, ClaimLifecycle, DiagnosisShape
from fleet import ingest
from fleet.ingest import Change, CursorUpdate
from fleet.ingest import rows as ingest_rows
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


@pytest.mark.django_db(transaction=True)
def test_a_claim_update_does_not_wait_for_the_foreign_key_checks_of_rows_pointing_to_it():
    # The diagnosis's new rows point to claims: their foreign-key checks lock those claims KEY SHARE at
    # commit. A watch batch updating one of them must not wait for that lock (under churn the two deadlocked
    # and PostgreSQL aborted one), while a claim recreated under its name still gets its new uid.
    cluster = ingest.get_or_create_cluster("fk-share")
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c", 100), claim_record("r", 100)))
    ids = dict(ResourceClaim.objects.filter(cluster=cluster).values_list("name", "id"))
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {ResourceClaim._meta.db_table} WHERE id = %s FOR KEY SHARE", [ids["c"]]
            )
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '3s'")  # waiting for the lock fails the test
            result = ingest.apply_batch(
                cluster,
                "ResourceClaim",
                upserts(claim_record("c", 101, [("n1", "gpu-0")]), claim_record("r", 101, uid="R2")),
            )
    finally:
        other.rollback()
        other.close()
    assert sorted(result.written) == [("ml", "c"), ("ml", "r")]
    stored = {c.name: c for c in ResourceClaim.objects.filter(cluster=cluster)}
    assert (stored["c"].uid, int(stored["c"].resource_version), stored["c"].state) == (
        "uid-c",
        101,
        "allocated",
    )
    assert stored["r"].uid == "R2"
    assert DeviceAllocation.objects.filter(cluster=cluster, claim_uid="uid-c").count() == 1


@pytest.mark.parametrize("read", ["absent", "as the record's"])
def test_a_key_another_writer_stored_under_another_uid_since_the_read_gets_the_records_uid(monkeypatch, read):
    # The batch reads the stored uids, then upserts. Meanwhile another writer (a late event of the name's
    # deleted object) stored uid U1 at an older version. The newer record (U2) must win whole: data and
    # uid, whether its key was read absent or already under U2.
    cluster = ingest.get_or_create_cluster("uid-race-absent" if read == "absent" else "uid-race-same")
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("k", 800, [("n1", "gpu-0")], uid="U1")))
    seen = {} if read == "absent" else {("ml", "k"): "U2"}
    monkeypatch.setattr(ingest_rows, "_stored_uids", lambda *args: seen)
    result = ingest.apply_batch(
        cluster, "ResourceClaim", upserts(claim_record("k", 900, [("n1", "gpu-1")], uid="U2"))
    )
    assert result.written == [("ml", "k")]
    row = ResourceClaim.objects.get(cluster=cluster, name="k")
    assert (row.uid, int(row.resource_version)) == ("U2", 900)
    held = DeviceAllocation.objects.filter(cluster=cluster, claim_uid="U2")
    assert list(held.values_list("device_name", flat=True)) == ["gpu-1"]
