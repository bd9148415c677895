"""Cost of the claim-history hook (claims.history) on a 40,000-claim relist, against the same relist with the
hook switched off (same run, same database, alternating), on PostgreSQL.

    DATABASE_URL=postgres://claimscope@127.0.0.1:55432/<scratch> REDIS_URL=redis://127.0.0.1:56379/<n> \
    SECRET_KEY=<32+ chars> SECURE_COOKIES=0 .venv/bin/python bench/bench_claim_history.py [claims] [rounds]

Three relists per round, each timed with and without the hook: (1) every claim new (pending), (2) the same
claims again, unchanged (the hook reads and writes nothing else), (3) every claim now allocated (one state
change each). Prints the median of the rounds and the ratio to the baseline.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from typing import Any

import django

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup()

from claims.models import ClaimLifecycle, ClaimStateChange  # noqa: E402
from fleet import ingest  # noqa: E402
from fleet.models import Cluster  # noqa: E402
from fleet.normalize import normalize  # noqa: E402
from simulator import nvidia as nv  # noqa: E402

CLUSTER = "bench-history"


def records(n: int, rv: int, allocated: bool) -> list[Any]:
    out = []
    request = [nv.exactly_request("gpu", "gpu.nvidia.com")]
    for i in range(n):
        obj = nv.claim_object("bench", f"claim-{i:05d}", request, created="2026-03-06T18:00:00Z")
        obj["metadata"].update(uid=f"uid-{i:05d}", resourceVersion=str(rv + i))
        if allocated:
            node = f"node-{i // 8:04d}"
            obj["status"] = nv.allocation_status([{"request": "gpu", "device": f"gpu-{i % 8}"}], node)
        out.append(normalize("ResourceClaim", obj))
    return out


def relist(cluster: Cluster, recs: list[Any], rv: int) -> float:
    start = time.perf_counter()
    ingest.replace_all(cluster, "ResourceClaim", recs, rv, cursor=False)
    return time.perf_counter() - start


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ingest.events.publish = lambda event: None  # measure the database work only
    ingest.events._listeners.clear()
    hooked = ingest.SPECS["ResourceClaim"]
    plain = dataclasses.replace(hooked, on_written=None, on_deleted=None)
    pending, again, allocated = (
        records(n, 1_000_000, False),
        records(n, 1_000_000, False),
        records(n, 2_000_000, True),
    )
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for label, spec in (("without hook", plain), ("with hook", hooked)):
            ingest.drop_cluster(CLUSTER)
            ClaimLifecycle.objects.all().delete()
            ClaimStateChange.objects.all().delete()
            cluster = ingest.get_or_create_cluster(CLUSTER)
            ingest.SPECS["ResourceClaim"] = spec
            for step, recs, rv in (("new", pending, 1_000_000 + n), ("unchanged", again, 1_000_000 + n),
                                   ("allocated", allocated, 2_000_000 + n)):  # fmt: skip
                times.setdefault((step, label), []).append(relist(cluster, recs, rv))
        ingest.SPECS["ResourceClaim"] = hooked
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    ingest.drop_cluster(CLUSTER)
    ClaimLifecycle.objects.all().delete()
    ClaimStateChange.objects.all().delete()
    print(f"{n} claims, median of {rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    for step in ("new", "unchanged", "allocated"):
        base = statistics.median(times[(step, "without hook")])
        hook = statistics.median(times[(step, "with hook")])
        print(
            f"  relist {step:<10} without hook {base:6.2f} s   with hook {hook:6.2f} s   "
            f"ratio {hook / base:4.2f}"
        )


if __name__ == "__main__":
    main()
