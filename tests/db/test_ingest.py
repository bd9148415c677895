import collections
import copy
import json
import threading

import orjson
import pytest
from django.db import OperationalError, connection, transaction
from django.db.models import JSONField
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from claims.models import ClaimLifecycle
from fleet import ingest
from fleet.ingest import Change, CursorUpdate
from fleet.models import Cluster, Device, DeviceAllocation, Node, ResourceClaim, ResourceSlice, WatchCursor
from fleet.normalize import normalize
from simulator import nvidia


@pytest.fixture
def cluster():
    return ingest.get_or_create_cluster("test")


def node(name, rv, ready=True, uid=None):
    obj = nvidia.node_object(name, "H100")
    obj["metadata"]["resourceVersion"] = str(rv)
    if uid:
        obj["metadata"]["uid"] = uid
    for cond in obj["status"]["conditions"]:
        if cond["type"] == "Ready":
            cond["status"] = "True" if ready else "False"
    return normalize("Node", obj)


def slice_record(node_name, rv, gpus=2, generation=1, model="B200"):
    (obj,) = nvidia.node_slices(node_name, model, mode="full", gpus=gpus, generation=generation)
    obj["metadata"]["resourceVersion"] = str(rv)
    return normalize("ResourceSlice", obj)


def claim_record(name, rv, devices=(), uid=None, namespace="ml"):
    obj = {
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
        },
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }
    if devices:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": dev}
                        for pool, dev in devices
                    ]
                }
            }
        }
    return normalize("ResourceClaim", obj)


def upserts(*records):
    return [Change("upsert", r) for r in records]


def test_it_adds_modifies_and_deletes(cluster):
    ingest.apply_batch(cluster, "Node", upserts(node("n1", 10), node("n2", 11)))
    assert set(Node.objects.values_list("name", flat=True)) == {"n1", "n2"}

    result = ingest.apply_batch(cluster, "Node", upserts(node("n1", 12, ready=False)))
    assert result.written == [("n1",)]
    assert Node.objects.get(name="n1").ready is False
    assert int(Node.objects.get(name="n1").resource_version) == 12

    result = ingest.apply_batch(cluster, "Node", [Change("delete", node("n2", 13))])
    assert result.deleted == [("n2",)]
    assert set(Node.objects.values_list("name", flat=True)) == {"n1"}


def test_it_ignores_a_stale_resource_version(cluster):
    ingest.apply_batch(cluster, "Node", upserts(node("n1", 20, ready=True)))
    result = ingest.apply_batch(cluster, "Node", upserts(node("n1", 19, ready=False)))
    assert result.written == [] and result.stale == 1
    assert Node.objects.get(name="n1").ready is True
    # A delete older than the stored object does not remove it either.
    ingest.apply_batch(cluster, "Node", [Change("delete", node("n1", 18))])
    assert Node.objects.filter(name="n1").exists()


def test_a_delete_for_another_uid_keeps_the_recreated_object(cluster):
    ingest.apply_batch(cluster, "Node", upserts(node("n1", 30, uid="new-uid")))
    ingest.apply_batch(cluster, "Node", [Change("delete", node("n1", 31, uid="old-uid"))])
    assert Node.objects.get(name="n1").uid == "new-uid"


def test_applying_a_batch_twice_equals_once(cluster):
    batch = upserts(slice_record("n1", 5), slice_record("n2", 6), claim_record("c", 7))
    slices, claims = batch[:2], batch[2:]

    def state():
        return (
            sorted(Device.objects.values_list("pool", "name", "slice_name", "kind")),
            sorted(ResourceSlice.objects.values_list("name", "resource_version")),
            sorted(ResourceClaim.objects.values_list("name", "state")),
        )

    ingest.apply_batch(cluster, "ResourceSlice", slices)
    ingest.apply_batch(cluster, "ResourceClaim", claims)
    once = state()
    ingest.apply_batch(cluster, "ResourceSlice", slices)
    ingest.apply_batch(cluster, "ResourceClaim", claims)
    assert state() == once
    assert len(once[0]) == 4


def test_slice_updates_replace_its_devices(cluster):
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 5, gpus=4)))
    assert Device.objects.filter(pool="n1").count() == 4
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 6, gpus=2, generation=2)))
    assert sorted(Device.objects.filter(pool="n1").values_list("name", flat=True)) == ["gpu-0", "gpu-1"]
    assert set(Device.objects.values_list("pool_generation", flat=True)) == {2}
    ingest.apply_batch(
        cluster, "ResourceSlice", [Change("delete", slice_record("n1", 7, gpus=2, generation=2))]
    )
    assert not Device.objects.exists()


def test_claim_allocations_follow_the_claim(cluster):
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 5, gpus=2)))
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c", 8, devices=[("n1", "gpu-1")])))
    alloc = DeviceAllocation.objects.select_related("device", "claim").get()
    assert alloc.device.name == "gpu-1" and alloc.claim.name == "c"
    assert ResourceClaim.objects.get(name="c").state == "allocated"
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c", 9)))
    assert not DeviceAllocation.objects.exists()
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c", 10, devices=[("n1", "gpu-0")])))
    ingest.apply_batch(cluster, "ResourceClaim", [Change("delete", claim_record("c", 11))])
    assert not DeviceAllocation.objects.exists() and not ResourceClaim.objects.exists()


def test_replace_deletes_what_the_list_no_longer_has(cluster):
    ingest.apply_batch(cluster, "Node", upserts(node("n1", 1), node("n2", 2), node("n3", 3)))
    ingest.apply_batch(cluster, "Node", upserts(node("late", 50)))  # newer than the list: kept
    result = ingest.replace_all(cluster, "Node", [node("n1", 1), node("n3", 4)], list_resource_version=40)
    assert sorted(result.deleted) == [("n2",)]
    assert set(Node.objects.values_list("name", flat=True)) == {"n1", "n3", "late"}
    cursor = WatchCursor.objects.get(cluster=cluster, kind="Node")
    assert int(cursor.resource_version) == 40 and cursor.object_count == 2


def test_the_cursor_is_saved_with_the_batch(cluster):
    ingest.apply_batch(cluster, "Node", upserts(node("n1", 1)), cursor=CursorUpdate(77))
    assert int(WatchCursor.objects.get(cluster=cluster, kind="Node").resource_version) == 77


def test_a_128_bit_resource_version_round_trips(cluster):
    big = 2**128 - 5
    ingest.apply_batch(cluster, "Node", upserts(node("n1", big)))
    assert int(Node.objects.get(name="n1").resource_version) == big
    assert ingest.apply_batch(cluster, "Node", upserts(node("n1", big - 1))).stale == 1


def test_query_count_per_batch_does_not_grow_with_the_batch(cluster, monkeypatch):
    # A batch that grows a table by a large part adds two statements (reltuples, ANALYZE), whatever its
    # size: tests/db/test_initial_sync_statistics.py. Off here, so both batches are ordinary ones.
    monkeypatch.setattr(ingest.statistics, "GROWN_OBJECTS", 10**9)

    def count(n, offset):
        records = [claim_record(f"c{offset + i}", 100 + i, devices=[("p", f"gpu-{i}")]) for i in range(n)]
        with CaptureQueriesContext(connection) as ctx:
            ingest.apply_batch(cluster, "ResourceClaim", upserts(*records))
        assert ResourceClaim.objects.count() == offset + n
        return len(ctx.captured_queries)

    assert count(10, 0) == count(1000, 10)


def test_one_change_event_per_batch_after_commit(cluster, monkeypatch, django_capture_on_commit_callbacks):
    sent: list[dict] = []
    monkeypatch.setattr(ingest.events, "publish", sent.append)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        ingest.apply_batch(cluster, "Node", upserts(node("n1", 1), node("n2", 2)))
        assert sent == []  # nothing before commit
    for callback in callbacks:
        callback()
    assert len(sent) == 1
    assert sent[0]["kind"] == "Node" and sorted(sent[0]["written"]) == ["n1", "n2"]


def test_the_last_change_of_an_object_in_a_batch_wins(cluster):
    n = node("n1", 1)
    ingest.apply_batch(cluster, "Node", [Change("upsert", n), Change("delete", copy.copy(n))])
    assert not Node.objects.exists()


def test_a_claim_recreated_under_its_name_drops_the_old_allocations(cluster):
    ingest.apply_batch(
        cluster, "ResourceClaim", upserts(claim_record("c", 5, devices=[("p", "gpu-0")], uid="u1"))
    )
    # Deleted and recreated within one batch (or a relist after a missed delete): only the new uid remains.
    ingest.apply_batch(
        cluster,
        "ResourceClaim",
        [Change("delete", claim_record("c", 6, uid="u1")), Change("upsert", claim_record("c", 7, uid="u2"))],
    )
    assert list(DeviceAllocation.objects.values_list("claim_uid", flat=True)) == []
    assert ResourceClaim.objects.get(name="c").uid == "u2"


def test_a_claim_recreated_in_one_namespace_leaves_its_namesake_in_another_alone(cluster):
    # Stored objects are looked up by their whole key (namespace and name), not by name alone.
    ingest.apply_batch(
        cluster,
        "ResourceClaim",
        upserts(
            claim_record("c", 5, devices=[("p", "gpu-0")], uid="ml-1"),
            claim_record("c", 6, devices=[("p", "gpu-1")], uid="web-1", namespace="web"),
        ),
    )
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c", 7, uid="ml-2")))
    assert sorted(ResourceClaim.objects.values_list("namespace", "uid")) == [("ml", "ml-2"), ("web", "web-1")]
    assert list(DeviceAllocation.objects.values_list("claim_uid", "device_name")) == [("web-1", "gpu-1")]
    lifecycles = dict(ClaimLifecycle.objects.values_list("uid", "deleted_at"))
    assert lifecycles["ml-1"] is not None and lifecycles["web-1"] is None


def test_a_device_keeps_its_newest_pool_generation_whatever_the_slice_order(cluster):
    (new_obj,) = nvidia.node_slices("n1", "B200", mode="full", gpus=1, generation=2)
    (old_obj,) = nvidia.node_slices("n1", "B200", mode="full", gpus=1, generation=1)
    new_obj["metadata"].update(name="a-new", uid="uid-new", resourceVersion="10")
    old_obj["metadata"].update(name="z-old", uid="uid-old", resourceVersion="5")
    records = [normalize("ResourceSlice", new_obj), normalize("ResourceSlice", old_obj)]
    ingest.replace_all(cluster, "ResourceSlice", records, list_resource_version=10)
    device = Device.objects.get()
    assert (device.slice_name, device.pool_generation) == ("a-new", 2)
    ingest.apply_batch(cluster, "ResourceSlice", [Change("delete", records[1])])
    assert Device.objects.filter(name="gpu-0", slice_name="a-new").exists()


def test_large_deletes_and_relists_work_in_chunks(cluster):
    nodes = [node(f"n{i:05d}", 10 + i) for i in range(2500)]
    ingest.apply_batch(cluster, "Node", upserts(*nodes))
    result = ingest.apply_batch(cluster, "Node", [Change("delete", n) for n in nodes[:1200]])
    assert len(result.deleted) == 1200
    result = ingest.replace_all(cluster, "Node", [], list_resource_version=10_000)
    assert len(result.deleted) == 1300
    assert not Node.objects.exists()


def test_a_list_older_than_the_cursor_replaces_everything(cluster):
    ingest.apply_batch(cluster, "Node", upserts(node("ghost", 900)), cursor=CursorUpdate(900))
    # The cluster was rebuilt: its versions restart lower than ours.
    ingest.replace_all(cluster, "Node", [node("fresh", 12)], list_resource_version=20)
    assert names_of(Node) == ["fresh"]
    assert int(WatchCursor.objects.get(cluster=cluster, kind="Node").resource_version) == 20


def names_of(model):
    return sorted(model.objects.values_list("name", flat=True))


def test_rows_are_prepared_as_djangos_fields_would_prepare_them(cluster):
    (obj,) = nvidia.node_slices("n1", "H100", mode="static-mig", layout="balanced")
    obj["metadata"]["resourceVersion"] = str(2**100)
    slice_ = normalize("ResourceSlice", obj)
    claim = claim_record("c", 7, devices=[("n1", "gpu-0")])
    samples = [
        (Node, [{**ingest.rows.common_row(node("n1", 3)), **ingest.SPECS["Node"].row(node("n1", 3))}]),
        (ResourceSlice, [{**ingest.rows.common_row(slice_), **ingest.SPECS["ResourceSlice"].row(slice_)}]),
        (Device, ingest.SPECS["ResourceSlice"].children[0].rows(slice_)),
        (ResourceClaim, [{**ingest.rows.common_row(claim), **ingest.SPECS["ResourceClaim"].row(claim)}]),
        (DeviceAllocation, ingest.SPECS["ResourceClaim"].children[0].rows(claim)),
    ]
    for model, rows in samples:
        for row in rows:
            row.update(cluster_id=cluster.pk, synced_at=timezone.now())
        names, values = ingest.sql.prep(model, rows)
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        assert names == [f.column for f in fields]
        for row, prepared in zip(rows, values, strict=True):
            for f, value in zip(fields, prepared, strict=True):
                if isinstance(f, JSONField):  # JSON text, for COPY and ::jsonb
                    assert json.loads(value) == row[f.attname], (model, f.name)
                else:
                    expected = f.get_db_prep_save(row[f.attname], connection)
                    # Django wraps big integers in psycopg's Int8 (an int) for typed binding: same value.
                    assert value == expected and isinstance(expected, type(value)), (model, f.name)


def test_json_that_orjson_refuses_is_encoded_like_the_standard_library():
    assert json.loads(ingest.sql.json_text({"big": 2**70, "k": {1: "x"}})) == {"big": 2**70, "k": {"1": "x"}}


@pytest.mark.parametrize(
    "value", [[], {}, None, 0, "", False, (), collections.OrderedDict(), collections.defaultdict(list)]
)
def test_empty_and_falsy_json_values_get_the_text_orjson_gives_them(value):
    assert ingest.sql.json_text(value) == orjson.dumps(value).decode()


def _mirrored(model, cluster):
    skip = {"id", "cluster", "synced_at"}
    names = [f.attname for f in model._meta.concrete_fields if f.name not in skip]
    return sorted(model.objects.filter(cluster=cluster).values_list(*names))


def test_an_initial_relist_writes_what_a_relist_over_stored_rows_writes():
    slices = [slice_record(f"n{i}", 10 + i, gpus=3) for i in range(4)]
    claims = [claim_record(f"c{i}", 20 + i, devices=[(f"n{i}", "gpu-1")]) for i in range(4)]
    fresh, used = ingest.get_or_create_cluster("fresh"), ingest.get_or_create_cluster("used")
    # "used" already holds an object the list no longer has: its relist takes the upsert path.
    ingest.apply_batch(used, "ResourceSlice", upserts(slice_record("gone", 1)))
    ingest.apply_batch(used, "ResourceClaim", upserts(claim_record("gone", 2, devices=[("gone", "gpu-0")])))
    for cluster in (fresh, used):
        for kind, records in (("ResourceSlice", slices), ("ResourceClaim", claims)):
            result = ingest.replace_all(cluster, kind, records, list_resource_version=100)
            assert sorted(result.written) == sorted(ingest.SPECS[kind].key_of(r) for r in records)
    for model in (ResourceSlice, Device, ResourceClaim, DeviceAllocation):
        assert _mirrored(model, fresh) == _mirrored(model, used), model


def test_only_a_relist_into_tables_empty_for_its_cluster_takes_the_copy_path(cluster):
    spec = ingest.SPECS["ResourceSlice"]
    with transaction.atomic():
        assert ingest.locks.lock_if_fresh(cluster, "ResourceSlice", spec)
    ingest.apply_batch(ingest.get_or_create_cluster("other"), "ResourceSlice", upserts(slice_record("n1", 1)))
    with transaction.atomic():
        assert ingest.locks.lock_if_fresh(cluster, "ResourceSlice", spec)  # other clusters' rows do not count
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 1)))
    with transaction.atomic():
        assert not ingest.locks.lock_if_fresh(cluster, "ResourceSlice", spec)


def test_after_an_initial_relist_the_fence_and_the_children_work_as_usual(cluster):
    ingest.replace_all(cluster, "ResourceSlice", [slice_record("n1", 10, gpus=4)], list_resource_version=10)
    assert ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 9, gpus=1))).stale == 1
    assert Device.objects.filter(pool="n1").count() == 4
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 11, gpus=2, generation=2)))
    assert sorted(Device.objects.values_list("name", flat=True)) == ["gpu-0", "gpu-1"]


@pytest.mark.django_db(transaction=True)
def test_an_initial_relist_holds_off_its_own_stream_only_until_it_commits():
    first, second = ingest.get_or_create_cluster("first"), ingest.get_or_create_cluster("second")
    locked, release = threading.Event(), threading.Event()

    def initial_relist() -> None:
        try:
            with transaction.atomic():
                assert ingest.locks.lock_if_fresh(first, "Node", ingest.SPECS["Node"])
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    def batch_within(cluster: Cluster, timeout: str) -> list[tuple[str, ...]]:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(f"SET LOCAL lock_timeout = '{timeout}'")
            return ingest.apply_batch(cluster, "Node", upserts(node("n1", 1))).written

    thread = threading.Thread(target=initial_relist)
    thread.start()
    try:
        assert locked.wait(10)
        with pytest.raises(OperationalError, match="lock timeout"):
            batch_within(first, "200ms")  # the same stream waits for the COPY to commit
        assert batch_within(second, "5s") == [("n1",)]  # another cluster's stream does not
        assert Node.objects.filter(cluster=first).count() == 0
    finally:
        release.set()
        thread.join(10)
    assert ingest.apply_batch(first, "Node", upserts(node("n1", 1))).written == [("n1",)]


def relist_events(cluster, monkeypatch, capture, records, version):
    sent: list[dict] = []
    monkeypatch.setattr(ingest.events, "publish", sent.append)
    with capture(execute=True):
        ingest.replace_all(cluster, "Node", records, list_resource_version=version)
    return sent


def test_a_relist_publishes_one_resync_event_with_counts_naming_its_keys_when_few(
    cluster, monkeypatch, django_capture_on_commit_callbacks
):
    ingest.apply_batch(cluster, "Node", upserts(node("old", 1), node("same", 2)))
    monkeypatch.setattr(ingest.events, "RELIST_KEYS", 2)  # as many as it changed
    sent = relist_events(
        cluster, monkeypatch, django_capture_on_commit_callbacks, [node("n1", 2), node("same", 2)], 10
    )
    assert sent == [
        {
            "type": "fleet.change",
            "cluster": "test",
            "kind": "Node",
            "resync": True,
            "written_count": 1,
            "deleted_count": 1,
            "written": ["n1"],
            "deleted": ["old"],
        }
    ]


def test_a_relist_of_more_than_relist_keys_objects_publishes_counts_only(
    cluster, monkeypatch, django_capture_on_commit_callbacks
):
    ingest.apply_batch(cluster, "Node", upserts(node("old", 1)))
    monkeypatch.setattr(ingest.events, "RELIST_KEYS", 2)
    sent = relist_events(
        cluster, monkeypatch, django_capture_on_commit_callbacks, [node("n1", 2), node("n2", 3)], 10
    )
    assert sent == [
        {
            "type": "fleet.change",
            "cluster": "test",
            "kind": "Node",
            "resync": True,
            "written_count": 2,
            "deleted_count": 1,
        }
    ]


@pytest.mark.parametrize("listed", [["n1"], []])
def test_a_relist_from_a_server_gone_back_in_time_names_what_it_deleted(
    cluster, monkeypatch, django_capture_on_commit_callbacks, listed
):
    # Every stored row is deleted before the list is written: those it does not list again are deleted
    # for good, and the event says so, even when the list is empty.
    ingest.replace_all(cluster, "Node", [node("old", 50)], list_resource_version=60)
    sent = relist_events(
        cluster, monkeypatch, django_capture_on_commit_callbacks, [node(n, 2) for n in listed], 10
    )
    assert len(sent) == 1 and sent[0]["resync"] is True
    assert (sent[0]["written"], sent[0]["deleted"]) == (listed, ["old"])
    assert sent[0]["deleted_count"] == 1
    assert list(Node.objects.filter(cluster=cluster).values_list("name", flat=True)) == listed


@pytest.mark.parametrize("n", [3, ingest.COPY_ROWS + 10])  # statements, then COPY
def test_write_rows_inserts_and_updates_on_its_conflict_key(cluster, n):
    def lives(state):
        return [
            {"cluster_id": cluster.pk, "uid": f"u{i}", "namespace": "ml", "name": f"c{i}", "state": state,
             "created_at": None, "first_pending_at": None, "allocated_at": None, "node": "n1",
             "devices": [f"gpu.nvidia.com/n1/gpu-{i}"], "released_at": None, "deleted_at": None,
             "updated_at": timezone.now()}
            for i in range(n)
        ]  # fmt: skip

    with transaction.atomic():
        ingest.write_rows(ClaimLifecycle, lives("pending"))
    with transaction.atomic():
        ingest.write_rows(ClaimLifecycle, lives("allocated")[: n - 1], conflict=("cluster_id", "uid"))
    states = dict(ClaimLifecycle.objects.filter(cluster=cluster).values_list("uid", "state"))
    assert len(states) == n and states[f"u{n - 1}"] == "pending"
    assert set(states.values()) - {"pending"} == {"allocated"}
    assert ClaimLifecycle.objects.get(cluster=cluster, uid="u1").devices == ["gpu.nvidia.com/n1/gpu-1"]
