"""A small simulated cluster for the utilization tests: full GPUs, static and dynamic MIG, an idle notebook,
a busy training run, MIG inference and a claim left pending behind them."""

from __future__ import annotations

from datetime import UTC, datetime

from simulator.cluster import SimulatedCluster
from simulator.naive_schedule import naive_schedule
from simulator.spec import build_fleet, spec_from_dict
from simulator.workloads import Simulation, mig_exact, product_is, training

START = datetime(2026, 3, 9, 8, 0, tzinfo=UTC)
FLEET = {
    "name": "usage",
    "pools": [
        {"name": "b200", "model": "B200", "nodes": 1},
        {"name": "h100-1g", "model": "H100", "nodes": 1, "mode": "static-mig", "layout": "all-1g", "gpus": 1},
        {"name": "h100-dyn", "model": "H100", "nodes": 1, "mode": "dynamic-mig", "gpus": 1},
    ],
}


def simulation() -> Simulation:
    """Played to START + 10 minutes: notebook-x holds 3 B200 idle, pretrain-0 4 busy, two static 1g
    slices and a dynamic 2g one serve chat, and finetune-0 (8 B200) waits."""
    cluster = SimulatedCluster()
    sim = Simulation(cluster, naive_schedule, START)
    sim.load_fleet(build_fleet(spec_from_dict(FLEET)))
    b200 = [product_is("NVIDIA B200")]
    sim.submit(training("ml-train", "notebook-x", START, 3, b200, None))
    sim.submit(training("ml-train", "pretrain-0", START, 4, b200, None))
    sim.submit(mig_exact("inference", "chat-1g-00", START, "1g.10gb", None))
    sim.submit(mig_exact("inference", "chat-1g-01", START, "1g.10gb", None))
    sim.submit(mig_exact("inference", "chat-2g-00", START, "2g.20gb", None))  # only dynamic MIG has 2g
    sim.submit(training("ml-train", "finetune-0", START.replace(minute=5), 8, b200, None))
    sim.run(START.replace(minute=10))
    return sim


def grouped(cluster: SimulatedCluster) -> dict[str, list[dict]]:
    """Every object of the simulated cluster by kind, as ``fleet.importer.import_objects`` takes them."""
    from simulator.cluster import KINDS

    return {kind: list(cluster.objects(kind)) for kind in KINDS}
