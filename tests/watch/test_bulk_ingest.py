"""A relist of thousands of objects takes ingest's COPY path: the same fence and results as small batches."""

from __future__ import annotations

import copy
import gc

import pytest

from fleet import ingest
from fleet.kube import reflector
from fleet.models import Node
from fleet.normalize import normalize
from fleet.simulator import nvidia

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
    assert reflector.ingest_list(cluster, "Node", objects, 20) == 3
    assert seen == [False] and gc.isenabled()
    assert Node.objects.filter(cluster=cluster).count() == 3
    gc.disable()
    try:  # a caller that turned it off keeps it off
        reflector.ingest_list(cluster, "Node", objects, 21)
        assert not gc.isenabled()
    finally:
        gc.enable()
