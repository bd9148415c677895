"""Benchmark: generate the L fleet preset (5,000 nodes x 8 GPUs) and load it into a SimulatedCluster.

    .venv/bin/python bench/bench_simulator.py [preset]

Target: generation + load of "L" under 20 s on a laptop core (measured ~4 s generation, ~5 s total, 2026-03).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.cluster import SimulatedCluster
from simulator.spec import build_fleet, preset

TARGET_SECONDS = 20.0


def main(name: str = "L") -> int:
    t0 = time.perf_counter()
    fleet = build_fleet(preset(name))
    t1 = time.perf_counter()
    cluster = SimulatedCluster(history_limit=10_000)
    cluster.bulk_create(fleet.objects())
    items, rv = cluster.list("ResourceSlice")
    t2 = time.perf_counter()
    devices = sum(len(s["spec"].get("devices", [])) for s in items)
    print(
        f"{name}: {len(fleet.nodes)} nodes, {sum(fleet.physical_gpus().values())} GPUs, {len(items)} slices, "
        f"{devices} devices; generate {t1 - t0:.2f}s, load+list {t2 - t1:.2f}s, rv {rv}"
    )
    total = t2 - t0
    print(
        f"total {total:.2f}s (target < {TARGET_SECONDS:.0f}s): {'OK' if total < TARGET_SECONDS else 'SLOW'}"
    )
    return 0 if total < TARGET_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
