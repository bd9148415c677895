"""A cluster's initial sync recomputes the per-GPU read model once: the slices' and the claims' first lists
run at the same time, and the first of them to commit leaves the whole cluster to the other
(``gpu_state.after_first_list``). Whoever pays, the rows end as a full recompute writes them. PostgreSQL
only, like the initial sync's COPY path (``lock_if_fresh``) it belongs to."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from fleet import ingest
from fleet.ingest import gpu_state
from fleet.kube.reflector import Reflector, StreamConfig
from fleet.kube.source import Forbidden
from fleet.models import GpuState, ReadModelVersion
from tests.db.test_ingest import claim_record, node, slice_record, upserts
from tests.fleet_pages.test_gpu_state import assert_read_model_is_current, stored_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setattr(ingest.events, "_notify", lambda event: None)
    return ingest.get_or_create_cluster("first-lists")


@pytest.fixture
def recomputes(monkeypatch) -> list[Any]:
    """The pools of every recompute (None: the whole cluster)."""
    seen: list[Any] = []
    refresh = gpu_state.refresh

    def counted(cluster_id: int, pools: Any = None, **kwargs: Any) -> int:
        seen.append(None if pools is None else sorted(pools))
        return refresh(cluster_id, pools, **kwargs)

    monkeypatch.setattr(gpu_state, "refresh", counted)
    return seen


def listing(cluster, kind: str, lease: float = 60) -> None:
    ingest.cursors.save_state(cluster, kind, "listing", "", lease)


def slices() -> list[Any]:
    return [slice_record("n1", 1, gpus=2), slice_record("n2", 2, gpus=2)]


def claims() -> list[Any]:
    return [claim_record("c1", 3, [("n1", "gpu-0")]), claim_record("c2", 4, [("n2", "gpu-1")])]


def owed(cluster) -> bool:
    return ReadModelVersion.objects.filter(cluster=cluster, owed=True).exists()


def test_of_two_first_lists_at_once_only_the_last_recomputes_the_cluster(cluster, recomputes):
    listing(cluster, "ResourceSlice")
    listing(cluster, "ResourceClaim")
    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    assert not GpuState.objects.filter(cluster=cluster).exists(), "left to the claims' list"
    assert owed(cluster)
    ingest.replace_all(cluster, "ResourceClaim", claims(), 4)
    assert recomputes == [None], "one whole-cluster recompute for the two lists"
    assert not owed(cluster)
    gpus = GpuState.objects.filter(cluster=cluster)
    assert gpus.count() == 4
    assert sorted(g.holders for g in gpus if g.holders) == [["ml/c1"], ["ml/c2"]]
    assert_read_model_is_current(cluster.pk)


@pytest.mark.parametrize("other", ["absent", "watching", "lease expired"])
def test_a_first_list_recomputes_at_once_when_no_other_list_is_running(cluster, recomputes, other):
    if other == "watching":
        ingest.replace_all(cluster, "ResourceClaim", [], 1)  # listed: its cursor says watching
    elif other == "lease expired":
        listing(cluster, "ResourceClaim", lease=-1)  # a worker that died in its list vouches for nothing
    recomputes.clear()
    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    assert recomputes == [None]
    assert GpuState.objects.filter(cluster=cluster).count() == 4
    assert not owed(cluster)


def test_the_next_batch_of_any_pool_pays_an_owed_recompute(cluster, recomputes):
    listing(cluster, "ResourceClaim")
    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    before = stored_rows()
    # A claim batch recomputes only the GPUs it holds, unless the cluster is owed.
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c1", 3, [("n1", "gpu-0")])))
    assert stored_rows() != before
    assert GpuState.objects.filter(cluster=cluster).count() == 4, "every pool's GPUs, not only n1's"
    assert not owed(cluster)
    assert_read_model_is_current(cluster.pk)


@pytest.fixture
def analyzed(monkeypatch) -> list[str]:
    """The ANALYZEs of the read model, by the ingest call that asked for them."""
    seen: list[str] = []
    analyze = ingest.statistics.analyze

    def recorded(tables: Any) -> None:
        tables = list(tables)
        if tables == list(gpu_state.READ_MODEL):
            seen.append("read model")
        analyze(tables)

    monkeypatch.setattr(ingest.statistics, "analyze", recorded)
    return seen


def test_a_watch_batch_that_pays_an_owed_recompute_analyzes_the_read_model(cluster, analyzed):
    # The batch writes one claim, too few to analyze for; the recompute it pays writes every pool's rows.
    listing(cluster, "ResourceClaim")
    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    assert owed(cluster) and analyzed == []
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c1", 3, [("n1", "gpu-0")])))
    assert analyzed == ["read model"]
    # Paid once: the next batch analyzes nothing.
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c2", 4, [("n2", "gpu-1")])))
    assert analyzed == ["read model"]


def test_a_device_taint_rule_batch_that_pays_an_owed_recompute_analyzes_the_read_model(cluster, analyzed):
    # The rule's hook recomputes the pools it taints, which the debt turns into the whole cluster; the kind
    # itself derives no read-model rows.
    from fleet.normalize import normalize
    from simulator import nvidia

    listing(cluster, "ResourceClaim")
    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    assert owed(cluster) and analyzed == []
    rule = nvidia.device_taint_rule("drain-n1", {"key": "maintenance", "effect": "NoSchedule"}, pool="n1")
    rule["metadata"]["resourceVersion"] = "3"
    ingest.apply_batch(cluster, "DeviceTaintRule", upserts(normalize("DeviceTaintRule", rule)))
    assert not owed(cluster)
    assert GpuState.objects.filter(cluster=cluster).count() == 4
    assert analyzed == ["read model"]


def test_a_payment_rolled_back_is_not_the_next_calls(cluster, analyzed, monkeypatch):
    listing(cluster, "ResourceClaim")
    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    refresh = gpu_state.refresh

    def failing(cluster_id: int, pools: Any = None, **kwargs: Any) -> int:
        refresh(cluster_id, pools, **kwargs)
        raise RuntimeError("the batch fails after its recompute")

    monkeypatch.setattr(gpu_state, "refresh", failing)
    with pytest.raises(RuntimeError):
        ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("c1", 3, [("n1", "gpu-0")])))
    monkeypatch.setattr(gpu_state, "refresh", refresh)
    assert owed(cluster), "rolled back with its batch"
    # A batch that recomputes nothing (a node's) paid nothing: the failed batch's mark is not its own.
    ingest.apply_batch(cluster, "Node", upserts(node("n1", 5)))
    assert analyzed == []
    ingest.apply_batch(cluster, "ResourceSlice", upserts(slice_record("n1", 6, gpus=2)))
    assert analyzed == ["read model"], "the next batch pays the debt, rolled back, and is analyzed"


class ForbiddenList:
    """A source whose list of every kind is refused."""

    def list(self, kind: str) -> Any:
        raise Forbidden(f'resourceclaims is forbidden: User "x" cannot list {kind}')

    def watch(self, kind: str, rv: str, timeout_seconds: Any = None) -> Any:
        raise AssertionError("never watched: the list failed")


def test_a_stream_whose_first_list_fails_pays_the_recompute_it_was_left(cluster, analyzed):
    reflector = Reflector(cluster, "ResourceClaim", ForbiddenList(), StreamConfig(forbidden_retry=0.01))
    listing(cluster, "ResourceClaim")  # what the reflector records before it lists
    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    assert owed(cluster)
    result = reflector.round(threading.Event())
    assert result.outcome == "forbidden"
    assert not owed(cluster)
    assert analyzed == ["read model"], "the recompute it paid is analyzed"
    assert GpuState.objects.filter(cluster=cluster).count() == 4
    assert_read_model_is_current(cluster.pk)


@pytest.mark.parametrize("claims_list", ["first and empty", "a relist that changed nothing"])
def test_a_list_that_writes_nothing_still_pays_what_it_was_left(cluster, claims_list, analyzed):
    if claims_list == "a relist that changed nothing":
        ingest.replace_all(cluster, "ResourceClaim", claims(), 4)  # stored; its relist (below) is not fresh
    listing(cluster, "ResourceClaim")
    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    assert owed(cluster) and not GpuState.objects.filter(cluster=cluster).exists()
    again = [] if claims_list == "first and empty" else claims()
    analyzed.clear()
    result = ingest.replace_all(cluster, "ResourceClaim", again, 5)
    assert not result.changed
    assert not owed(cluster)
    assert analyzed == ["read model"], "the recompute it paid is analyzed"
    assert GpuState.objects.filter(cluster=cluster).count() == 4
    assert_read_model_is_current(cluster.pk)


def test_a_failed_round_settles_once_its_state_no_longer_says_listing(cluster, monkeypatch):
    # Settled while the stream still said "listing", a first list committing in between would leave the
    # recompute to this stream again, until its next round.
    states = []
    settle = gpu_state.settle

    def watched(cluster_id: int) -> bool:
        states.append(ingest.cursors.listing(cluster, ["ResourceClaim"]))
        return settle(cluster_id)

    monkeypatch.setattr(gpu_state, "settle", watched)
    reflector = Reflector(cluster, "ResourceClaim", ForbiddenList(), StreamConfig(forbidden_retry=0.01))
    reflector.round(threading.Event())
    assert states == [False]


def test_the_migrations_rebuild_reads_no_debt_before_its_table_exists(cluster):
    # Migration 0008 fills the read model through rebuild_all, before 0011 creates the versions' table.
    from django.db import connection

    ingest.replace_all(cluster, "ResourceSlice", slices(), 2)
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the deferred foreign-key checks of its rows first
        cur.execute("DROP TABLE fleet_readmodelversion")  # rolled back with the test's transaction
    gpu_state.rebuild_all([cluster.pk])
    assert GpuState.objects.filter(cluster=cluster).count() == 4
