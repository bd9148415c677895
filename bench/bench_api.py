"""Benchmark: REST API server time on the simulator's "L" fleet (5,000 nodes, about 120k devices).

    DATABASE_URL=postgres://.../scratch REDIS_URL=redis://.../N SECRET_KEY=... SECURE_COOKIES=0 \\
        .venv/bin/python bench/bench_api.py [--reuse]

Targets (issue 7): a 10,000-device list page and the summary over the L fleet within 200 ms of server time
each. The fleet (plus synthetic claims holding ~60% of whole GPUs, from bench_heatmap) is ingested into the
"bench-api" cluster of DATABASE_URL (a scratch database: replaced unless --reuse). Requests go through the
whole Django stack in-process (middleware, session auth, DRF, renderer); the figure is the best of 5 after a
warm-up. For comparison it also times the same device page through DRF serializers + DRF's JSON renderer.
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

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from rest_framework.renderers import JSONRenderer  # noqa: E402

from fleet import ingest  # noqa: E402
from fleet.api import selectors as api_selectors  # noqa: E402
from fleet.api.serializers import DeviceRow  # noqa: E402
from fleet.importer import import_objects  # noqa: E402
from fleet.models import Cluster, Device  # noqa: E402
from simulator.cluster import SimulatedCluster  # noqa: E402
from simulator.spec import build_fleet, preset  # noqa: E402

CLUSTER = "bench-api"
TARGET_MS = 200.0


def best_of(n: int, fn: Any) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return min(times), result


def load_fleet(reuse: bool) -> None:
    if reuse and Cluster.objects.filter(name=CLUSTER).exists():
        return
    from bench.bench_heatmap import synthetic_claims

    Cluster.objects.filter(name=CLUSTER).delete()
    t0 = time.perf_counter()
    fleet = build_fleet(preset("L"))
    simulated = SimulatedCluster(history_limit=10)  # stamps resourceVersions, as an API server would
    simulated.bulk_create(fleet.objects())
    grouped = {kind: simulated.list(kind)[0] for kind in ("DeviceClass", "Node", "ResourceSlice")}
    grouped["ResourceClaim"] = synthetic_claims(fleet)
    cluster = ingest.get_or_create_cluster(CLUSTER, "bench_api: the L preset")
    report = import_objects(cluster, grouped)
    print(f"ingested the L fleet in {time.perf_counter() - t0:.0f} s: {report.written}")
    assert not report.errors, report.errors[:3]


def summary_after_a_change(get: Any) -> float:
    """One claim re-ingested (a fleet change): the next summary request reads the updated read model."""
    from fleet.models import ResourceClaim
    from fleet.normalize import normalize

    cluster = Cluster.objects.get(name=CLUSTER)
    claim = ResourceClaim.objects.filter(cluster=cluster).order_by("id").first()
    assert claim is not None
    raw = {**claim.raw, "kind": "ResourceClaim"}
    raw["metadata"] = {**raw["metadata"], "resourceVersion": str(time.time_ns())}
    ingest.apply_batch(cluster, "ResourceClaim", [ingest.Change("upsert", normalize("ResourceClaim", raw))])
    t0 = time.perf_counter()
    get("/api/v1/summary/")
    ms = (time.perf_counter() - t0) * 1000
    print(f"{'summary right after a change':38} {ms:7.0f} ms")
    return ms


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reuse", action="store_true", help="keep an already ingested bench-api cluster")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    load_fleet(args.reuse)
    devices = Device.objects.count()
    assert devices > 100_000, f"expected the L fleet, found {devices} devices"
    user, _ = get_user_model().objects.get_or_create(username="bench-api")
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    results: dict[str, float] = {}

    def get(url: str) -> Any:
        response = client.get(url)
        assert response.status_code == 200, response.content[:300]
        return response

    for name, url in (
        ("devices page (10,000 rows)", "/api/v1/devices/?page_size=10000"),
        ("devices page (10,000 rows) as CSV", "/api/v1/devices/?page_size=10000&format=csv"),
        ("gpus page (10,000 GPUs)", "/api/v1/gpus/?page_size=10000"),
        ("summary (whole fleet)", "/api/v1/summary/"),
    ):
        get(url)  # warm-up: connection, caches, imports
        ms, response = best_of(5, lambda url=url: get(url))
        with CaptureQueriesContext(connection) as queries:
            get(url)
        results[name] = ms
        print(f"{name:38} {ms:7.0f} ms  {len(response.content):>11,} bytes  {len(queries)} queries")

    ms, _ = best_of(2, api_selectors.compute_summary)
    print(f"{'summary computed (the read model)':38} {ms:7.0f} ms")
    results["summary after a change"] = summary_after_a_change(get)

    rows = list(Device.objects.values("id")[:10_000])
    instances = list(Device.objects.select_related("cluster").filter(id__in=[r["id"] for r in rows]))

    def drf_path() -> bytes:
        data = [
            {**d.__dict__, "cluster": d.cluster.name, "allocated": False, "claim": None}
            for d in instances  # attribute access only: the same fields, serialized by DRF
        ]
        return JSONRenderer().render(DeviceRow(data, many=True).data)

    ms, _ = best_of(3, drf_path)
    print(f"{'(same page via DRF serializers)':38} {ms:7.0f} ms  (serialization + rendering only)")
    print(f"fleet: {devices:,} devices in the database")
    targets = ("devices page (10,000 rows)", "summary (whole fleet)", "summary after a change")
    ok = all(results[k] <= TARGET_MS for k in targets)
    print(f"target: devices page and summary within {TARGET_MS:.0f} ms each: {'OK' if ok else 'SLOW'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
