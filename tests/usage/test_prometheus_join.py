"""Sampling utilization through the real Prometheus scraping the dcgm-exporter stand-in."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.usage import prom
from tests.usage.conftest import CLUSTER
from usage import selectors
from usage.config import PrometheusConfig
from usage.ingest import Thresholds
from usage.models import ClaimUsage, DeviceUsage, SamplingState
from usage.prometheus import PrometheusSource
from usage.sampler import sample_cluster
from usage.tasks import sample_utilization

pytestmark = pytest.mark.prometheus

ENTITIES = 17  # 8 B200 + 7 static 1g instances + 1 dynamic 2g instance + the foreign GPU
LIMITS = Thresholds(below=0.05, window=timedelta(minutes=30), interval=timedelta(minutes=1))


def _usage(cluster, pool_prefix: str, device: str) -> DeviceUsage:
    return DeviceUsage.objects.get(cluster=cluster, pool__startswith=pool_prefix, device=device)


def test_it_joins_by_dra_labels_uuid_and_mig_instance(cluster, scraped):
    report = sample_cluster(cluster, scraped(ENTITIES), timezone.now(), LIMITS)
    assert report.ok, report.error

    held = _usage(cluster, "b200", "gpu-0")
    assert (held.matched_by, held.namespace) == ("dra", "ml-train")
    assert held.claim.startswith("notebook-x")
    assert held.active is not None and held.active < 0.05
    assert held.fb_used_bytes is not None and held.fb_total_bytes is not None
    assert 0 < held.fb_used_bytes < held.fb_total_bytes
    busy = _usage(cluster, "b200", "gpu-3")
    assert busy.matched_by == "dra"
    assert busy.active is not None and busy.active > 0.8
    free = _usage(cluster, "b200", "gpu-7")
    assert (free.matched_by, free.claim, free.active) == ("uuid", "", 0.0)

    static = _usage(cluster, "h100-1g", "gpu-0-mig-1g10gb-19-0")
    assert static.matched_by == "dra" and static.instance_id and static.claim.startswith("chat-1g-00")
    # Free static instances carry no DRA labels; one profile's free slices on one GPU are interchangeable.
    assert _usage(cluster, "h100-1g", "gpu-0-mig-1g10gb-19-2").matched_by == "mig-free"
    dynamic = _usage(cluster, "h100-dyn", "gpu-0-mig-2g20gb-14-0")
    assert (dynamic.matched_by, dynamic.instance_id) == ("mig-profile", "1")
    assert dynamic.claim.startswith("chat-2g-00")  # from our allocations: the series has no DRA labels

    state = SamplingState.objects.get(cluster=cluster)
    assert state.matched == ENTITIES - 1
    assert state.unmatched == {"GPU UUID not in the fleet": 1}
    assert state.unmatched_examples[0]["Hostname"] == "gone-node"
    assert state.unavailable_since is None


def test_it_finds_the_idle_claim_and_not_the_busy_one(cluster, scraped):
    source = scraped(ENTITIES)
    start = timezone.now()
    for minute in range(0, 41, 10):
        assert sample_cluster(cluster, source, start + timedelta(minutes=minute), LIMITS).ok

    found = selectors.idle_claims(start, start + timedelta(hours=1), 5.0, LIMITS.window)
    names = [c.claim.rsplit("-", 3)[0] for c in found]
    assert names == ["notebook-x"]
    idle = found[0]
    assert (idle.cluster, idle.namespace, idle.model, idle.devices, idle.gpus) == (
        CLUSTER,
        "ml-train",
        "B200",
        3,
        3.0,
    )
    assert idle.idle_since == start
    # Four 10-minute steps, each counted at most two sampling intervals (the rounds here are 10 min apart).
    assert idle.idle_gpu_hours == pytest.approx(3 * 4 * 2 / 60, abs=1e-6)
    waste = selectors.waste(found)
    assert [(w.namespace, w.model) for w in waste] == [("ml-train", "B200")]


def test_a_restarted_exporter_leaves_a_gap_not_zero(cluster, scraped, exporter, prometheus_url):
    source = scraped(ENTITIES)
    start = timezone.now()
    assert sample_cluster(cluster, source, start, LIMITS).ok
    exporter.stop()

    def stale() -> bool:
        return (
            not source.entities().entities
        )  # Prometheus marks a dead target's series stale at its next scrape

    prom.wait_for(stale, "the stopped exporter's series to go stale")
    assert sample_cluster(cluster, source, start + timedelta(minutes=1), LIMITS).ok
    held = _usage(cluster, "b200", "gpu-0")
    assert held.active is None  # a gap, never 0 %
    holding = ClaimUsage.objects.get(cluster=cluster, pool__startswith="b200", device="gpu-0")
    assert (holding.samples, holding.gap_samples, holding.idle_since) == (1, 1, start)

    exporter.start()  # the same port: the exporter is back
    scraped(ENTITIES)
    assert sample_cluster(cluster, source, start + timedelta(minutes=2), LIMITS).ok
    assert _usage(cluster, "b200", "gpu-0").active is not None


def test_prometheus_stopped_mid_run_degrades_and_recovers(cluster, exporter, tmp_path):
    private = prom.PrivatePrometheus(tmp_path, exporter.port)
    private.start()
    try:
        source = PrometheusSource(PrometheusConfig(CLUSTER, private.url), timeout=3)
        prom.wait_for(lambda: source.entities().entities, "the private Prometheus's first scrape")
        start = timezone.now()
        assert sample_cluster(cluster, source, start, LIMITS).ok
        before = _usage(cluster, "b200", "gpu-3").active

        private.stop()
        report = sample_cluster(cluster, source, start + timedelta(minutes=1), LIMITS)
        assert not report.ok and private.url in report.error
        state = SamplingState.objects.get(cluster=cluster)
        assert state.unavailable_since == start + timedelta(minutes=1)
        assert state.last_ok_at == start
        assert _usage(cluster, "b200", "gpu-3").active == before  # the last values stay as they were
        assert selectors.unavailable_since() == start + timedelta(minutes=1)

        private.start()
        prom.wait_for(lambda: source.entities().entities, "the restarted Prometheus's first scrape")
        assert sample_cluster(cluster, source, start + timedelta(minutes=2), LIMITS).ok
        state.refresh_from_db()
        assert state.unavailable_since is None and state.last_error == ""
    finally:
        private.stop()


def test_the_beat_task_samples_every_mirrored_cluster_with_a_prometheus(cluster, scraped, settings):
    source = scraped(ENTITIES)
    settings.CLAIMSCOPE_PROMETHEUS = {
        CLUSTER: source.config,
        "not-mirrored": PrometheusConfig("not-mirrored", source.config.url),
    }
    assert sample_utilization() == {CLUSTER: True}
    assert SamplingState.objects.get(cluster=cluster).matched == ENTITIES - 1
