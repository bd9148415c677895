"""The demo's moving parts, all in one process: the simulated cluster, its churn, and the watch streams.

The simulator plays the ``monday`` scenario (Friday evening to Monday 09:00) with the allocator replay as
its scheduler, then keeps running live: random workloads arrive and finish at ``speed`` simulated seconds
per real second. Reflector threads mirror it into the database exactly as workers mirror a real cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import close_old_connections, connection

from claims.simulation import allocator_schedule
from fleet import ingest
from fleet.kube.reflector import Reflector, StreamConfig
from fleet.normalize import KINDS
from fleet.simulator import scenarios
from fleet.simulator.spec import build_fleet, spec_from_dict
from fleet.simulator.workloads import Simulation, random_workloads

log = logging.getLogger(__name__)
CLUSTER_NAME = "demo"


@dataclass
class Demo:
    simulation: Simulation
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def shutdown(self, timeout: float = 5.0) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)


def prepare(seed: int = 0) -> Simulation:
    """Play the weekend (a few seconds) and queue the live workload mix that follows it."""
    simulation = scenarios.monday_simulation(seed, schedule=allocator_schedule)
    simulation.run(scenarios.MONDAY_09)
    fleet = build_fleet(spec_from_dict({**scenarios.MONDAY_FLEET, "seed": seed}))
    for workload in random_workloads(fleet, seed, scenarios.MONDAY_09, hours=24 * 7, per_hour=6):
        simulation.submit(workload)
    # Hardware trouble during the week: a GPU raises a fatal XID, later a whole node vanishes.
    names = [n["metadata"]["name"] for n in fleet.nodes]
    simulation.xid(scenarios.MONDAY_09 + timedelta(hours=2), names[0], gpu_minor=3)
    simulation.node_loss(scenarios.MONDAY_09 + timedelta(hours=30), names[-1])
    return simulation


def _stream(demo: Demo, kind: str) -> None:
    try:
        cluster = ingest.get_or_create_cluster(CLUSTER_NAME, "simulated fleet (make demo)")
        config = StreamConfig(watch_timeout=30.0, idle_timeout=90.0)
        Reflector(cluster, kind, demo.simulation.cluster, config).run(demo.stop)
    except Exception:
        log.exception("demo stream %s stopped", kind)
    finally:
        connection.close()


def churn(simulation: Simulation, stop: threading.Event, speed: float, tick: float = 1.0) -> None:
    """Advance the simulation ``speed * tick`` simulated seconds every ``tick`` real seconds until stopped."""
    try:
        while not stop.wait(tick):
            simulation.run(simulation.now + timedelta(seconds=speed * tick))
    except Exception:
        log.exception("simulation stopped")
    finally:
        close_old_connections()


def start(seed: int = 0, speed: float = 60.0) -> Demo:
    """Start the streams (one thread per kind) and the live churn; returns a handle to stop them.

    Each run simulates a new cluster whose resourceVersions start over, so the previous run's mirror
    (and its watch cursors) is dropped first: resuming from old cursors would freeze the old state.
    """
    ingest.drop_cluster(CLUSTER_NAME)
    demo = Demo(prepare(seed))
    for kind in KINDS:
        demo.threads.append(
            threading.Thread(target=_stream, args=(demo, kind), name=f"demo-{kind}", daemon=True)
        )
    demo.threads.append(
        threading.Thread(
            target=churn, args=(demo.simulation, demo.stop, speed), name="demo-churn", daemon=True
        )
    )
    for thread in demo.threads:
        thread.start()
    return demo


def wait_synced(timeout: float = 60.0) -> bool:
    """True once every stream has listed (the database holds the weekend's state)."""
    from fleet.models import WatchCursor

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = WatchCursor.objects.filter(cluster__name=CLUSTER_NAME, state="watching").count()
        if ready >= len(KINDS):
            return True
        time.sleep(0.2)
    return False
