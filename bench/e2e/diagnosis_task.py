"""Time ``claims.tasks.recompute_diagnoses`` in-process on the database ``bench_e2e.py`` left behind.

    DATABASE_URL=... REDIS_URL=... SECRET_KEY=... \\
        .venv/bin/python bench/e2e/diagnosis_task.py [sim] [gc|scan|task]

Phases: ``FleetState.from_db`` (every object of the cluster from its stored JSON), ``prepare``, and the
whole task; with ``gc``, the task also runs once with the cyclic collector paused
(``fleet.kube.reflector.cyclic_gc_paused``) to show what full collections over the fleet's objects cost;
with ``scan``, ``pods_of_claim`` is the former scan of every pod (the "before" figure); with ``task``, only
the task runs, in a fresh process, so the peak RSS printed is that of a worker child running it once.
Prints the collector's generation-2 collections, the resident set (current and peak, ``VmRSS``/``VmHWM``)
and the load average with every figure.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from claims.diagnosis import prepare  # noqa: E402
from claims.fleetstate import FleetState  # noqa: E402
from claims.tasks import recompute_diagnoses  # noqa: E402
from fleet.gcpause import cyclic_gc_paused  # noqa: E402


def memory_mb() -> tuple[float, float]:
    """(current, peak) resident set of this process in MB, from ``/proc/self/status`` (Linux)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024  # kB
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def timed(label: str, fn: object) -> object:
    full = gc.get_stats()[2]["collections"]
    t = time.perf_counter()
    out = fn()  # type: ignore[operator]
    full = gc.get_stats()[2]["collections"] - full
    load = os.getloadavg()[0]
    rss, peak = memory_mb()
    print(
        f"{label}: {time.perf_counter() - t:.1f}s (full collections {full}, rss {rss:.0f} MB, "
        f"peak {peak:.0f} MB, load {load:.2f})",
        flush=True,
    )
    return out


def _pods_of_claim_scan(self: FleetState, claim: dict[str, Any]) -> list[dict[str, Any]]:
    """``FleetState.pods_of_claim`` as it was before the per-state index (a scan of every pod per claim),
    for the before/after figure."""
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    out = []
    for pod in self.objects["Pod"]:
        if (pod.get("metadata") or {}).get("namespace", "") != ns:
            continue
        names = {
            st.get("resourceClaimName") for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        names |= {rc.get("resourceClaimName") for rc in (pod.get("spec") or {}).get("resourceClaims") or []}
        if name in names:
            out.append(pod)
    return out


def main(cluster: str = "sim", mode: str = "") -> int:
    if mode == "scan":
        FleetState.pods_of_claim = _pods_of_claim_scan  # type: ignore[method-assign]
    if mode == "task":
        timed("recompute_diagnoses (alone)", lambda: recompute_diagnoses(cluster))
        return 0
    state = timed("FleetState.from_db", lambda: FleetState.from_db(cluster))
    timed("prepare", lambda: prepare(state))  # type: ignore[arg-type]
    timed("recompute_diagnoses (collector on)", lambda: recompute_diagnoses(cluster))
    if mode == "gc":

        def paused() -> object:
            with cyclic_gc_paused():
                return recompute_diagnoses(cluster)

        timed("recompute_diagnoses (collector paused)", paused)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
