"""The diagnosis update after a relist that changed a few slices (a watch restarted), with the relist's
event naming its keys (as now) and counting them only (as before: the kind read again whole, every pending
claim diagnosed again), back to back, in process, on the L fleet.

    DATABASE_URL=postgres://.../claimscope_<scratch> REDIS_URL=... SECRET_KEY=... \
        .venv/bin/python bench/e2e/relist_update.py [rounds] [changed]

The scratch database must hold a fleet as cluster "sim" (``bench/e2e/load_fleet.py``, or what
``bench_e2e.py`` leaves). First the full recompute (the worker's first update), then per round and mode:
``changed`` GPU slices get a taint, the whole ResourceSlice kind is relisted through ``ingest.replace_all``,
and ``update_diagnoses`` is timed. Changes the database: use a scratch copy.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from bench.e2e.incremental_update import tainted  # noqa: E402
from claims import tasks  # noqa: E402
from fleet import ingest  # noqa: E402
from fleet.models import Cluster, ResourceSlice  # noqa: E402
from fleet.normalize import normalize  # noqa: E402

CLUSTER = "sim"


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 3
    changed = int(argv[1]) if len(argv) > 1 else 3
    tasks.update_diagnoses.apply_async = lambda *a, **kw: None  # no broker
    tasks.notify_pending_changed = lambda cluster: None
    cluster = Cluster.objects.get(name=CLUSTER)
    t = time.perf_counter()
    tasks.recompute_diagnoses(CLUSTER)
    print(f"full recompute: {time.perf_counter() - t:.2f} s, load {os.getloadavg()[0]:.2f}")
    raws = {s.name: s.raw for s in ResourceSlice.objects.filter(cluster=cluster)}
    gpu = sorted(
        ResourceSlice.objects.filter(
            cluster=cluster, device_count__gt=0, driver="gpu.nvidia.com"
        ).values_list("name", flat=True)
    )
    records = {
        name: normalize("ResourceSlice", {**raw, "kind": "ResourceSlice"}) for name, raw in raws.items()
    }
    took: dict[str, list[float]] = {"named": [], "counted": []}
    keys_limit = ingest.events.RELIST_KEYS
    step = 0
    for r in range(rounds):
        for mode in ("named", "counted"):
            ingest.events.RELIST_KEYS = keys_limit if mode == "named" else 0
            for name in gpu[step * changed : (step + 1) * changed]:
                obj = tainted(raws[name])
                raws[name], records[name] = obj, normalize("ResourceSlice", obj)
            step += 1
            version = max(int(rec.meta.resource_version) for rec in records.values())
            result = ingest.replace_all(
                cluster, "ResourceSlice", list(records.values()), list_resource_version=version, cursor=False
            )
            t = time.perf_counter()
            counts = tasks.update_diagnoses(CLUSTER)
            took[mode].append(time.perf_counter() - t)
            print(
                f"round {r} {mode}: relist wrote {len(result.written)}, update {took[mode][-1]:.2f} s "
                f"{counts} load {os.getloadavg()[0]:.2f}"
            )
    ingest.events.RELIST_KEYS = keys_limit
    named, counted = statistics.median(took["named"]), statistics.median(took["counted"])
    print(
        f"update after a relist of {changed} changed slices: named {named:.2f} s, "
        f"counted only {counted:.2f} s (ratio {named / counted:.2f}x); load {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
