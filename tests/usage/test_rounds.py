"""Sampling rounds through the same sampler as production, from the stand-in in process (no Prometheus:
these run on SQLite and PostgreSQL alike)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleet import ingest
from fleet.normalize import normalize
from simulator import dcgm
from usage.ingest import Thresholds
from usage.models import ClaimUsage, SamplingState
from usage.sampler import sample_cluster

LIMITS = Thresholds(below=0.05, window=timedelta(minutes=30), interval=timedelta(minutes=1))


def test_a_round_after_a_slice_change_joins_against_the_changed_fleet(cluster, sim):
    source = dcgm.InProcessSource(lambda: dcgm.cluster_series(sim.cluster, dcgm.now()))
    at = timezone.now()
    assert sample_cluster(cluster, source, at, LIMITS).ok
    assert SamplingState.objects.get(cluster=cluster).unmatched == {}

    # The dynamic-MIG node's slice goes away; its exporter still reports the MIG instance.
    gone = [
        s for s in sim.cluster.objects("ResourceSlice") if s["spec"]["pool"]["name"].startswith("h100-dyn")
    ]
    assert gone
    ingest.apply_batch(
        cluster, "ResourceSlice", [ingest.Change("delete", normalize("ResourceSlice", s)) for s in gone]
    )
    assert sample_cluster(cluster, source, at + timedelta(minutes=1), LIMITS).ok
    assert SamplingState.objects.get(cluster=cluster).unmatched == {
        "MIG instance of an unknown GPU or profile": 1
    }


def test_holdings_of_many_claims_are_read_back_in_chunks(cluster, sim, monkeypatch):
    from usage import ingest as usage_ingest

    monkeypatch.setattr(usage_ingest, "CLAIM_CHUNK", 2)  # five claims hold devices: three chunks
    source = dcgm.InProcessSource(lambda: dcgm.cluster_series(sim.cluster, dcgm.now()))
    at = timezone.now()
    for minute in range(3):
        assert sample_cluster(cluster, source, at + timedelta(minutes=minute), LIMITS).ok
    rows = ClaimUsage.objects.filter(cluster=cluster)
    assert {r.claim.rsplit("-", 3)[0] for r in rows} == {
        "notebook-x",
        "pretrain-0",
        "chat-1g-00",
        "chat-1g-01",
        "chat-2g-00",
    }
    # Every holding was found again in every round: its accounting went on, none started over.
    assert {(r.first_seen, r.samples + r.gap_samples) for r in rows} == {(at, 3)}
