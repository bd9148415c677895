"""Benchmark: the overview's and the summary's counts from the per-GPU read model, against the per-device
computation the read model replaced, on the simulator's fleet (default "L": 5,000 nodes, ~120k devices).

    DATABASE_URL=postgres://.../scratch REDIS_URL=redis://.../N SECRET_KEY=... SECURE_COOKIES=0 \\
        .venv/bin/python bench/bench_readmodel.py [--preset L] [--reuse]

Target (issue 21): overview and summary cold (no cache) within 300 ms on L; read-model upkeep per watch
batch small next to the batch. The fleet plus bench_heatmap's synthetic claims is imported into the
"bench-readmodel" cluster of DATABASE_URL (a scratch database: replaced unless --reuse) through ingest,
which fills the read model and analyzes the tables it grew, so a fresh database runs as fast as a reused
one. "per device" is the path both counts took before the read model (every current device and
allocation read and counted in Python; the summary's path on every database, the overview's on SQLite):
the ratio is measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from django.core.cache import cache  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from fleet import ingest, overview, selectors  # noqa: E402
from fleet.api import selectors as api_selectors  # noqa: E402
from fleet.filters import FleetFilter  # noqa: E402
from fleet.importer import import_objects  # noqa: E402
from fleet.ingest import gpu_state  # noqa: E402
from fleet.models import Cluster, Device, GpuState  # noqa: E402
from simulator.cluster import SimulatedCluster  # noqa: E402
from simulator.spec import build_fleet, preset  # noqa: E402

CLUSTER = "bench-readmodel"
BASELINE = "bench-readmodel-baseline"
TARGET_MS = 300.0


def timed(n: int, fn: Any) -> tuple[float, float, Any]:
    """(first call's ms, best of the rest, result)."""
    times, result = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times[0], min(times[1:] or times), result


def load_fleet(name: str, reuse: bool) -> None:
    """Import the fleet into CLUSTER; first, as the baseline, into a second cluster the way imports ran
    before one_refresh (each kind's batch in its own transaction, recomputing the pools it touched)."""
    if reuse and Cluster.objects.filter(name=CLUSTER).exists():
        return
    from bench.bench_heatmap import synthetic_claims
    from fleet.importer import INGEST_ORDER, normalize_many
    from fleet.importer import ImportReport as Report

    Cluster.objects.filter(name__in=(CLUSTER, BASELINE)).delete()
    fleet = build_fleet(preset(name))
    simulated = SimulatedCluster(history_limit=10)
    simulated.bulk_create(fleet.objects())
    grouped = {kind: simulated.list(kind)[0] for kind in ("DeviceClass", "Node", "ResourceSlice")}
    grouped["ResourceClaim"] = synthetic_claims(fleet)

    baseline = ingest.get_or_create_cluster(BASELINE, "bench_readmodel: the baseline import")
    t0 = time.perf_counter()
    for kind in INGEST_ORDER:  # a copy per run: normalize completes hand-written objects in place
        records = normalize_many(kind, [dict(o) for o in grouped.get(kind, [])], Report(), BASELINE)
        if records:
            ingest.apply_batch(baseline, kind, [ingest.Change("upsert", r) for r in records])
    before = time.perf_counter() - t0
    Cluster.objects.filter(name=BASELINE).delete()

    cluster = ingest.get_or_create_cluster(CLUSTER, f"bench_readmodel: the {name} preset")
    t0 = time.perf_counter()
    report = import_objects(cluster, grouped)
    took = time.perf_counter() - t0
    print(f"imported the {name} fleet in {took:.1f} s (read model included): {report.written}")
    print(
        f"{'import, a refresh per kind (before)':34} {before:8.1f} s; one refresh: {took:.1f} s, "
        f"{before / took:.1f}x faster"
    )
    assert not report.errors, report.errors[:3]


def one_claim_batch(cluster: Cluster) -> tuple[float, float]:
    """A watch batch re-writing one allocated claim: its time, and the read model's share of it."""
    from fleet.models import DeviceAllocation, ResourceClaim
    from fleet.normalize import normalize

    uid = DeviceAllocation.objects.filter(cluster=cluster).values_list("claim_uid", flat=True).first()
    claim = ResourceClaim.objects.get(cluster=cluster, uid=uid)
    raw = {**claim.raw, "kind": "ResourceClaim"}
    raw["metadata"] = {**raw["metadata"], "resourceVersion": str(time.time_ns())}
    spent: list[float] = []
    refresh = gpu_state.refresh

    def measured(*args: Any, **kwargs: Any) -> int:
        t0 = time.perf_counter()
        try:
            return refresh(*args, **kwargs)
        finally:
            spent.append((time.perf_counter() - t0) * 1000)

    gpu_state.refresh = measured
    try:
        t0 = time.perf_counter()
        ingest.apply_batch(
            cluster, "ResourceClaim", [ingest.Change("upsert", normalize("ResourceClaim", raw))]
        )
        total = (time.perf_counter() - t0) * 1000
    finally:
        gpu_state.refresh = refresh
    return total, sum(spent)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="L")
    parser.add_argument("--reuse", action="store_true", help="keep an already ingested bench cluster")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    load_fleet(args.preset, args.reuse)
    cluster = Cluster.objects.get(name=CLUSTER)
    print(f"fleet: {Device.objects.count():,} devices, {GpuState.objects.count():,} GPU rows")
    names = {cluster.pk: cluster.name}
    scope = selectors.OverviewScope((cluster.pk,))
    results: dict[str, float] = {}
    rows = [
        ("summary, per device (before)", lambda: selectors.fleet_summary_per_device()),
        ("summary, read model", lambda: api_selectors.compute_summary()),
        ("overview, per device (before)", lambda: overview.overviews_per_device(FleetFilter(), names)),
        ("overview, read model", lambda: overview.compute_overviews(scope, FleetFilter(), names)),
    ]
    for label, fn in rows:
        cache.clear()
        cold, warm, _ = timed(3, fn)
        results[label] = cold
        print(f"{label:34} cold {cold:8.0f} ms   warm {warm:8.1f} ms")
    for what in ("summary", "overview"):
        ratio = results[f"{what}, per device (before)"] / max(results[f"{what}, read model"], 0.001)
        print(f"{what}: the read model is {ratio:.0f}x the per-device path (cold)")

    def rebuild() -> int:
        with transaction.atomic():  # as ingest calls it: COPY, and the read-model lock
            return gpu_state.refresh(cluster.pk)

    _, full, _ = timed(2, rebuild)
    print(f"{'read model full rebuild (initial sync)':34} {full:8.0f} ms")
    total, share = one_claim_batch(cluster)
    print(f"{'one-claim watch batch':34} {total:8.1f} ms, of which read model {share:.1f} ms")
    ok = results["summary, read model"] <= TARGET_MS and results["overview, read model"] <= TARGET_MS
    print(f"target: overview and summary cold within {TARGET_MS:.0f} ms: {'OK' if ok else 'SLOW'}")
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
