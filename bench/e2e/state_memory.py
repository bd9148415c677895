"""Where the diagnosis worker's memory goes: its live fleet built stage by stage, in process, with the
resident set after each stage, on the database ``load_fleet.py`` (or ``bench_e2e.py``) leaves.

    DATABASE_URL=... REDIS_URL=... SECRET_KEY=... \\
        .venv/bin/python bench/e2e/state_memory.py [cluster] [whatif]

Stages: the lean objects (``LiveFleet.load``, with the seconds each kind took to read), the per-pool
device rows (``state.devices()``), the holders and pod indexes, ``prepare`` (the per-fleet context), every
pending claim diagnosed; then the state released and the fleet dropped. With ``whatif``, instead: one
what-if as the web process answers it (``FleetState.from_db(lean=True)``, then one pending claim
diagnosed), and the same on the whole fleet (``lean=False``, as before the what-if went lean), each in a
fresh process, with its peak. The baseline is the code before a change, run on the same database (``cd``
into a worktree of it: the code is imported from the current directory). Prints the load average with
every figure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from bench.e2e.diagnosis_task import memory_mb  # noqa: E402
from claims.diagnosis import diagnose, prepare  # noqa: E402
from claims.fleetstate import FleetState  # noqa: E402
from claims.livestate import LiveFleet  # noqa: E402
from claims.models import ResourceClaim  # noqa: E402
from claims.tasks import Shapes  # noqa: E402
from fleet.gcpause import cyclic_gc_paused  # noqa: E402


class Stages:
    def __init__(self) -> None:
        self.last = memory_mb()[0]
        print(f"start: {self.last:.0f} MB (code in {os.getcwd()})", flush=True)

    def run(self, label: str, fn: Any) -> Any:
        t = time.perf_counter()
        out = fn()
        rss, peak = memory_mb()
        print(
            f"{label}: {rss - self.last:+.0f} MB -> {rss:.0f} MB, peak {peak:.0f} MB "
            f"({time.perf_counter() - t:.1f} s, load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
        self.last = rss
        return out


def live(cluster: str) -> None:
    stages = Stages()
    read: dict[str, float] = {}  # seconds per kind read
    reload = LiveFleet._reload

    def timed(fleet: LiveFleet, kind: str) -> None:
        t = time.perf_counter()
        reload(fleet, kind)
        read[kind] = time.perf_counter() - t

    LiveFleet._reload = timed  # type: ignore[method-assign,assignment]
    # As the worker does: loading and indexing create ~10^7 long-lived objects.
    with cyclic_gc_paused():
        fleet = stages.run("lean objects (LiveFleet.load)", lambda: LiveFleet.load(cluster))
        LiveFleet._reload = reload  # type: ignore[method-assign]
        print("   " + ", ".join(f"{k} {len(v)}" for k, v in fleet.objects.items() if v), flush=True)
        print("   read in " + ", ".join(f"{k} {s:.1f} s" for k, s in read.items()), flush=True)
        build(stages, cluster, fleet.state())
        stages.run("state released (fleet kept)", lambda: None)
        fleet.objects.clear()
        fleet.shared.clear()
        fleet.rows.pools.clear()
        fleet._ordered.clear()
        stages.run("fleet dropped", lambda: None)


def build(stages: Stages, cluster: str, state: FleetState) -> None:
    """The state's indexes and every pending claim's diagnosis; the state is released on return."""
    with state:
        devices = stages.run("device rows (state.devices)", state.devices)
        print(f"   {len(devices)} devices", flush=True)
        stages.run("holders and pod index", lambda: (state.holders(), state._pod_index()))
        stages.run("prepare (per-fleet context)", lambda: prepare(state))
        pending = list(ResourceClaim.objects.filter(cluster__name=cluster, state="pending").order_by("id"))
        shapes = Shapes(state)
        stages.run(f"{len(pending)} pending claims diagnosed", lambda: [shapes.text_of(c) for c in pending])


def whatif(cluster: str, lean: bool) -> None:
    stages = Stages()
    claim = ResourceClaim.objects.filter(cluster__name=cluster, state="pending").order_by("id").first()
    if claim is None:
        raise SystemExit(f"no pending claim in cluster {cluster!r}")
    state = stages.run(f"from_db(lean={lean})", lambda: FleetState.from_db(cluster, lean=lean))
    result = stages.run(
        "one claim diagnosed", lambda: diagnose(state, {**claim.raw, "kind": "ResourceClaim"})
    )
    print(f"   category {result.category}", flush=True)


def main(cluster: str = "sim", mode: str = "") -> int:
    if mode == "whatif":
        for lean in (True, False):  # each in a fresh process: its own peak
            subprocess.run([sys.executable, __file__, cluster, f"whatif-{lean}"], check=True)
    elif mode.startswith("whatif-"):
        whatif(cluster, mode == "whatif-True")
    else:
        live(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
