"""Fill a scratch database with the end-to-end benchmark's L fleet, as cluster "sim", without the servers.

    DATABASE_URL=postgres://.../claimscope_x SECRET_KEY=... .venv/bin/python bench/e2e/load_fleet.py [preset]

The same objects ``bench/e2e/simserver.py`` serves (the preset's nodes and slices, 38,000 allocated claims
with their running pods, 2,000 pending claims in the diagnosis shapes), written through the watchers'
relist code (``fleet.kube.reflector.ingest_list``), so the database equals what ``bench_e2e.py`` leaves
after its initial sync. For profiling pages, the feed and the diagnosis task in-process in seconds instead
of a whole end-to-end run. The database must be migrated; the cluster's rows are replaced.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from bench.e2e.simserver import build  # noqa: E402
from fleet import ingest  # noqa: E402
from fleet.importer import INGEST_ORDER  # noqa: E402
from fleet.kube.reflector import ingest_list  # noqa: E402


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "L"
    started = time.perf_counter()
    sim, _, _ = build(name)
    cluster = ingest.get_or_create_cluster("sim")
    for kind in INGEST_ORDER:
        objects, version = sim.list(kind)
        t = time.perf_counter()
        ingest_list(cluster, kind, [objects], int(version))
        print(f"{kind}: {len(objects)} objects in {time.perf_counter() - t:.1f}s", flush=True)
    print(f"loaded preset {name} as cluster 'sim' in {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
