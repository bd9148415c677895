"""Time the incremental diagnosis update against the full recompute, in-process, on the database
``load_fleet.py`` (or ``bench_e2e.py``) leaves behind (cluster "sim").

    DATABASE_URL=… REDIS_URL=… SECRET_KEY=… .venv/bin/python bench/e2e/incremental_update.py [rounds]

First the full recompute (``recompute_diagnoses``: the baseline, and the load of the worker's fleet), then
``rounds`` fleet changes, each written through ingest and followed by ``update_diagnoses`` as the worker
runs it: a taint on one GPU (the change ``bench_e2e.py`` times), a device freed (an allocated claim
deleted) and its claim written back. Prints per change the time from the commit to the stored diagnoses,
how many claims were diagnosed and written, and the load average; then the process's memory: resident
after the recompute, the peak of the recompute, and the peak of the updates alone (VmHWM started over after
the recompute), which is where the state before a change and the state after it could overlap. Changes the
database: use a scratch copy.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from bench.e2e.diagnosis_task import memory_mb  # noqa: E402
from claims import tasks  # noqa: E402
from fleet import ingest  # noqa: E402
from fleet.models import Cluster, ResourceClaim, ResourceSlice  # noqa: E402
from fleet.normalize import normalize  # noqa: E402

CLUSTER = "sim"
TAINT = {"key": "bench.claimscope.io/incremental", "value": "x", "effect": "NoSchedule"}


def bumped(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["kind"] = kind
    meta = obj["metadata"]
    meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 0) + 1_000_000_000)
    return obj


def tainted(raw: dict[str, Any]) -> dict[str, Any]:
    """A slice's stored object at a newer resourceVersion, its first device given TAINT."""
    obj = bumped(raw, "ResourceSlice")
    device = obj["spec"]["devices"][0]
    device["taints"] = [*(device.get("taints") or []), TAINT]
    return obj


def timed_update() -> tuple[float, dict[str, int]]:
    """``update_diagnoses`` timed; with ``PROFILE=1`` in the environment, its top functions printed
    (``PROFILE_SORT``: a pstats sort key, default ``cumulative``; ``PROFILE_TOP``: how many, default 25)."""
    profile = None
    if os.environ.get("PROFILE"):
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    t = time.perf_counter()
    counts = tasks.update_diagnoses(CLUSTER)
    took = time.perf_counter() - t
    if profile is not None:
        import pstats

        profile.disable()
        pstats.Stats(profile).sort_stats(os.environ.get("PROFILE_SORT", "cumulative")).print_stats(
            int(os.environ.get("PROFILE_TOP", "25"))
        )
    return took, counts


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 5
    tasks.update_diagnoses.apply_async = lambda *a, **kw: None  # no broker
    tasks.notify_pending_changed = lambda cluster: None
    cluster = Cluster.objects.get(name=CLUSTER)
    pending = ResourceClaim.objects.filter(cluster=cluster, state="pending").count()
    t = time.perf_counter()
    tasks.recompute_diagnoses(CLUSTER)
    full = time.perf_counter() - t
    print(f"full recompute (baseline): {full:.2f} s for {pending} pending claims, load {os.getloadavg()}")
    after_recompute, recompute_peak = memory_mb()
    # The shared diagnosis of a shape is each claim's own: a sample diagnosed alone, on the same state.
    # Released before the updates: the worker keeps no state between updates.
    with tasks._live[CLUSTER].fleet.state() as state:
        shapes = tasks.Shapes(state)
        sample = ResourceClaim.objects.filter(cluster=cluster, state="pending").order_by("?")[:40]
        for row in sample:
            alone = json.loads(json.dumps(tasks.diagnosis_of(state, row)))
            assert shapes.of(row) == alone, f"{row.name}: the shared diagnosis differs from its own"
        print(f"shared diagnoses of {len(sample)} sampled claims equal their own ({len(shapes.done)} shapes)")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts over: the updates' own peak (Linux)
    took: list[float] = []
    gpu_slices = ResourceSlice.objects.filter(cluster=cluster, device_count__gt=0, driver="gpu.nvidia.com")
    slices = list(gpu_slices.order_by("name")[:rounds])
    allocated = ResourceClaim.objects.filter(cluster=cluster, state__in=["allocated", "reserved"])
    held = list(allocated.order_by("name")[:rounds])
    for i in range(rounds):
        obj = tainted(slices[i].raw)
        change = ingest.Change("upsert", normalize("ResourceSlice", obj))
        ingest.apply_batch(cluster, "ResourceSlice", [change])
        s, counts = timed_update()
        took.append(s)
        print(f"taint on {obj['metadata']['name']}: {s:.2f} s {counts} load {os.getloadavg()[0]:.2f}")
        claim = bumped(held[i].raw, "ResourceClaim")
        record = normalize("ResourceClaim", claim)
        ingest.apply_batch(cluster, "ResourceClaim", [ingest.Change("delete", record)])
        s, counts = timed_update()
        took.append(s)
        print(f"claim {held[i].name} deleted: {s:.2f} s {counts}")
        claim = bumped(claim, "ResourceClaim")
        ingest.apply_batch(
            cluster, "ResourceClaim", [ingest.Change("upsert", normalize("ResourceClaim", claim))]
        )
        s, counts = timed_update()
        took.append(s)
        print(f"claim {held[i].name} back: {s:.2f} s {counts}")
    took.sort()
    rss, updates_peak = memory_mb()
    print(
        f"memory: after the recompute {after_recompute:.0f} MB (its peak {recompute_peak:.0f} MB); "
        f"peak of the updates {updates_peak:.0f} MB; after them {rss:.0f} MB"
    )
    print(
        f"incremental update: median {statistics.median(took):.2f} s, max {took[-1]:.2f} s over {len(took)} "
        f"changes; full recompute {full:.2f} s; load {os.getloadavg()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
