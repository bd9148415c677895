"""A relist of thousands of objects takes ingest's COPY path: the same fence and results as small batches."""

from __future__ import annotations

import copy
import gc
import threading

import pytest
from django.db import connection, transaction

from fleet import gcpause, ingest
from fleet.kube import reflector
from fleet.models import Device, Node
from fleet.normalize import normalize
from simulator import nvidia
from tests.db.test_ingest import node, slice_record

N = ingest.COPY_ROWS + 500


def nodes(version: int, label: str) -> list:
    out = []
    for i in range(N):
        obj = copy.deepcopy(nvidia.node_object(f"bulk-{i:05d}", "H100"))
        obj["metadata"]["resourceVersion"] = str(version + i)
        obj["metadata"]["labels"]["pass"] = label
        out.append(normalize("Node", obj))
    return out


@pytest.mark.django_db
def test_a_large_relist_keeps_the_resource_version_fence():
    cluster = ingest.get_or_create_cluster("bulk")
    first = ingest.replace_all(cluster, "Node", nodes(1000, "first"), 10**6)
    assert len(first.written) == N and first.stale == 0
    # Older versions of every object: all stale, nothing overwritten.
    older = ingest.apply_batch(cluster, "Node", [ingest.Change("upsert", r) for r in nodes(10, "older")])
    assert older.written == [] and older.stale == N
    assert not Node.objects.filter(cluster=cluster, labels__pass="older").exists()
    newer = ingest.apply_batch(cluster, "Node", [ingest.Change("upsert", r) for r in nodes(5000, "newer")])
    assert len(newer.written) == N
    assert Node.objects.filter(cluster=cluster, labels__pass="newer").count() == N


@pytest.mark.django_db
def test_a_relist_pauses_the_cyclic_collector_only_while_it_runs(monkeypatch):
    cluster = ingest.get_or_create_cluster("bulk")
    seen: list[bool] = []
    replace_all = ingest.replace_all

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return replace_all(*args, **kwargs)

    monkeypatch.setattr(ingest, "replace_all", spy)
    objects = [nvidia.node_object(f"gc-{i}", "H100") for i in range(3)]
    for i, obj in enumerate(objects):
        obj["metadata"]["resourceVersion"] = str(10 + i)
    assert gc.isenabled()
    assert reflector.ingest_list(cluster, "Node", [objects], 20) == 3
    assert seen == [False] and gc.isenabled()
    assert Node.objects.filter(cluster=cluster).count() == 3
    gc.disable()
    try:  # a caller that turned it off keeps it off
        reflector.ingest_list(cluster, "Node", [objects], 21)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_relists_keep_the_collector_off_until_the_last_one_ends():
    # The worker's threads relist a cluster's kinds at the same time: the first relist to end must not
    # turn the collector back on under the others.
    assert gc.isenabled()
    first = gcpause.cyclic_gc_paused()
    second = gcpause.cyclic_gc_paused()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()
    gc.disable()
    try:  # off before the first one began: stays off after the last one
        with gcpause.cyclic_gc_paused(), gcpause.cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.django_db(transaction=True)
def test_initial_relists_of_two_kinds_of_a_cluster_run_at_the_same_time(monkeypatch):
    # The worker's threads sync a cluster's kinds concurrently, each on its own connection: the initial
    # sync's exclusive lock is per (cluster, kind), so one kind's COPY never waits for another's commit.
    cluster = ingest.get_or_create_cluster("concurrent")
    fresh: list[tuple[str, bool]] = []
    lock_if_fresh = ingest.locks.lock_if_fresh

    def spy(cluster, kind, spec):
        fresh.append((kind, lock_if_fresh(cluster, kind, spec)))
        return fresh[-1][1]

    monkeypatch.setattr(ingest.locks, "lock_if_fresh", spy)
    # No change events: their listeners (diagnosis, summary) are not under test here, and with them an
    # extra session could outlive the test and block dropping the test database.
    monkeypatch.setattr(ingest.events, "_notify", lambda event: None)
    copied, release = threading.Event(), threading.Event()

    def node_relist() -> None:
        try:
            with transaction.atomic():  # holds the Node stream's lock until released
                ingest.replace_all(cluster, "Node", [node("n1", 1)], 10)
                copied.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=node_relist)
    thread.start()
    try:
        assert copied.wait(10)
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET LOCAL lock_timeout = '5s'")
            result = ingest.replace_all(cluster, "ResourceSlice", [slice_record("n1", 10, gpus=4)], 10)
        assert len(result.written) == 1
        assert Device.objects.filter(cluster=cluster).count() == 4
        assert not Node.objects.filter(cluster=cluster).exists()  # the other is still uncommitted
    finally:
        release.set()
        thread.join(10)
    assert fresh == [("Node", True), ("ResourceSlice", True)]
    assert Node.objects.filter(cluster=cluster).count() == 1
