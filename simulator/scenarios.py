"""Named scenarios: a fleet plus a timeline of workloads, played through a SimulatedCluster.

`monday` is the on-call story from the design: a Friday-evening training burst fills every B200/B300; more
big-memory jobs queue behind it; on Saturday MIG 1g slices run out while 3g slices sit idle; a few claims are
broken (CEL error, an attribute nobody publishes, impossible memory); a notebook claim leaks (allocated, no
pod). The result is the full event sequence a watcher would have seen, ending Monday 09:00.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from simulator import nvidia as nv
from simulator.cluster import SimulatedCluster
from simulator.naive_schedule import naive_schedule
from simulator.scheduling import Schedule
from simulator.spec import FleetSpec, build_fleet, spec_from_dict
from simulator.workloads import Simulation, Workload, broken, memory_at_least, mig_exact, product_is, training

Obj = dict[str, Any]

FRIDAY_17 = datetime(2026, 3, 6, 17, 0, tzinfo=UTC)
MONDAY_09 = datetime(2026, 3, 9, 9, 0, tzinfo=UTC)

MONDAY_FLEET: dict[str, Any] = {
    "name": "monday",
    "pools": [
        {"name": "b200", "model": "B200", "nodes": 2, "clique_size": 2, "compute_domain": True},
        {"name": "b300", "model": "B300", "nodes": 1},
        {"name": "h100-1g", "model": "H100", "nodes": 1, "mode": "static-mig", "layout": "all-1g"},
        {"name": "h100-3g", "model": "H100", "nodes": 1, "mode": "static-mig", "layout": "all-3g"},
        {"name": "h200", "model": "H200", "nodes": 1},
        {"name": "h100-dyn", "model": "H100", "nodes": 1, "mode": "dynamic-mig"},
    ],
}


@dataclass
class Scenario:
    """A played scenario: the cluster at the end, and every watch event in order (all kinds)."""

    name: str
    spec: FleetSpec
    cluster: SimulatedCluster
    events: list[Obj]
    start: datetime
    end: datetime


def _jitter(rng: random.Random, base: datetime, minutes: float) -> datetime:
    return base + timedelta(minutes=rng.uniform(0, minutes))


def monday_shift(end: datetime | None) -> timedelta:
    """How far the scenario moves when anchored to end at `end` (None: its own Monday 09:00, no shift)."""
    if end is None:
        return timedelta(0)
    if end.tzinfo is None:
        raise ValueError(f"monday scenario end {end.isoformat()} has no time zone")
    return end - MONDAY_09


def monday_workloads(seed: int = 0, shift: timedelta = timedelta(0)) -> list[Workload]:
    """The monday timeline (deterministic for `seed`), every time moved by `shift` (see monday_shift).

    The random draws do not depend on `shift`: a shifted timeline is the same weekend, only later."""
    rng = random.Random(f"monday/{seed}")
    friday = FRIDAY_17 + shift
    big = [memory_at_least("150Gi")]
    out: list[Workload] = []
    # Friday 18:00-19:00: three 8-GPU pretraining jobs take every B200 and B300 until after the weekend.
    for i in range(3):
        out.append(
            training("ml-train", f"pretrain-{i}", _jitter(rng, friday + timedelta(hours=1), 60), 8, big, 90)
        )
    # Friday 19:00: a full-GPU H100 job takes the DynamicMIG node's GPUs (so no dynamic 1g partitions either).
    out.append(
        training(
            "ml-train",
            "h100-sweep",
            friday + timedelta(hours=2),
            8,
            [product_is("NVIDIA H100 80GB HBM3")],
            90,
        )
    )
    # Friday 20:00 - Saturday 06:00: nine more jobs that need >= 150Gi queue behind them.
    for i in range(9):
        at = _jitter(rng, friday + timedelta(hours=3), 600)
        out.append(training("ml-train", f"finetune-{i}", at, rng.choice([1, 2, 4]), big, 12))
    # Saturday: four 3g services, then 61 1g inference pods: 56 fit the all-1g node, 5 stay pending
    # while 12 3g slices are idle.
    sat = datetime(2026, 3, 7, 8, 0, tzinfo=UTC) + shift
    for i in range(4):
        out.append(
            mig_exact("inference", f"rag-3g-{i}", _jitter(rng, sat, 60), "3g.40gb", None, template="mig-3g")
        )
    for i in range(61):
        at = _jitter(rng, sat + timedelta(hours=1), 600)
        out.append(mig_exact("inference", f"chat-1g-{i:02d}", at, "1g.10gb", None, template="mig-1g"))
    # A few broken claims.
    out.append(broken("research", "bad-cel", datetime(2026, 3, 7, 10, 0, tzinfo=UTC) + shift, "broken-cel"))
    out.append(
        broken("research", "bad-attr", datetime(2026, 3, 7, 14, 0, tzinfo=UTC) + shift, "unknown-attribute")
    )
    out.append(
        broken("research", "huge-kv", datetime(2026, 3, 8, 9, 0, tzinfo=UTC) + shift, "impossible-memory")
    )
    out.sort(key=lambda w: (w.arrival, w.name))
    return out


def monday_simulation(
    seed: int = 0,
    schedule: Schedule | None = None,
    history_limit: int = 200_000,
    end: datetime | None = None,
) -> Simulation:
    """The monday simulation, loaded and queued but not yet run (callers may continue it past Monday).

    `end` anchors the weekend in time: it then ends at `end` instead of 2026-03-09 09:00 (every time moved
    by the same amount; run it until ``end``). The demo anchors it to its start, so the weekend just ended."""
    shift = monday_shift(end)
    spec = spec_from_dict({**MONDAY_FLEET, "seed": seed})
    cluster = SimulatedCluster(history_limit=history_limit)
    sim = Simulation(cluster, schedule or naive_schedule, FRIDAY_17 + shift)
    sim.load_fleet(build_fleet(spec))
    for w in monday_workloads(seed, shift):
        sim.submit(w)
    # Friday 20:00: a notebook grabs an H200; its pod is deleted at 23:00 but the claim stays allocated.
    sim.leak(
        datetime(2026, 3, 6, 20, 0, tzinfo=UTC) + shift,
        "ml-train",
        "notebook-alice-gpu",
        nv.exactly_request("gpu", "gpu.nvidia.com", selectors=[product_is("NVIDIA H200")]),
        timedelta(hours=3),
    )
    return sim


def monday(seed: int = 0, schedule: Schedule | None = None, history_limit: int = 200_000) -> Scenario:
    """Play the monday scenario from Friday 17:00 to Monday 09:00 and return it with its event sequence.

    `schedule` defaults to the naive stand-in; pass the real allocator's adapter once it exists.
    """
    sim = monday_simulation(seed, schedule, history_limit)
    sim.run(MONDAY_09)
    spec = spec_from_dict({**MONDAY_FLEET, "seed": seed})
    return Scenario("monday", spec, sim.cluster, sim.cluster.history(), FRIDAY_17, MONDAY_09)
