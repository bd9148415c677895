"""The demo's moving parts, all in one process: the simulated cluster, its churn, and the watch streams.

The simulator plays the ``monday`` scenario (Friday evening to Monday 09:00) with the allocator replay as
its scheduler, anchored so that its Monday 09:00 is the demo's start: the weekend just ended. The weekend is
replayed into the database at its simulated times (simulator.replay: claim history, pending causes and
allocation samples of the weekend, so the pending page and the triage report have something to say at
once). Then it keeps running live: random workloads arrive and finish at ``speed`` simulated seconds per real
second, and reflector threads, resuming from the replayed state, mirror it into the database exactly as
workers mirror a real cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import beat
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from fleet import ingest
from fleet.kube.reflector import Reflector, StreamConfig
from fleet.normalize import KINDS
from simulator import replay, scenarios
from simulator.scheduling_allocator import allocator_schedule
from simulator.spec import build_fleet, spec_from_dict
from simulator.workloads import Simulation, random_workloads

log = logging.getLogger(__name__)
CLUSTER_NAME = "demo"
# The production beat schedule's entries the demo runs in its own process (settings.CELERY_BEAT_SCHEDULE):
# the allocation history and the claim-history retention. Not the stream restarts: the demo's streams are
# its own threads, not Celery tasks.
BEAT_ENTRIES = ("history-sample", "history-downsample", "claim-history-prune")
# Workloads arriving per (uncompressed) hour of the live week: about what the fleet serves, so that the
# pending page drains as well as grows (at 6 an hour the mix asks for about four times the fleet's GPUs
# and the queue only grows).
WEEK_ARRIVALS_PER_HOUR = 1.0


@dataclass
class Demo:
    simulation: Simulation
    weekend_start: datetime  # the anchored Friday 17:00
    weekend_end: datetime  # the anchored Monday 09:00: when the demo started
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    beat: Any = None  # celery.beat's embedded service thread (untyped in celery)

    @property
    def triage_since(self) -> datetime:
        """The weekend's triage window starts Friday 18:00, as the on-call report's default does."""
        return self.weekend_start + timedelta(hours=1)

    def shutdown(self, timeout: float = 5.0) -> None:
        self.stop.set()
        if self.beat is not None:
            self.beat.service.stop()  # its loop wakes at least every second
        for thread in self.threads:
            thread.join(timeout)


def anchor(now: datetime | None = None) -> datetime:
    """The demo's Monday 09:00: now (default the current time), to the minute."""
    return (now or timezone.now()).replace(second=0, microsecond=0)


def queue_week(simulation: Simulation, seed: int, monday: datetime, compress: float = 1.0) -> None:
    """Queue the live workload mix of the week that follows the weekend ending at ``monday`` (the
    simulation's clock), compressed ``compress`` times: arrivals that many times denser, runs that many times
    shorter, and what the weekend left queued (its jobs' ends, its pending pods' retries) that many times
    sooner, so that its long jobs end and free capacity within the live week too."""
    simulation.compress(compress)
    fleet = build_fleet(spec_from_dict({**scenarios.MONDAY_FLEET, "seed": seed}))
    week = random_workloads(
        fleet,
        seed,
        monday,
        hours=24 * 7 / compress,
        per_hour=WEEK_ARRIVALS_PER_HOUR * compress,
        durations=1 / compress,
    )
    for workload in week:
        simulation.submit(workload)
    # Hardware trouble during the week: a GPU raises a fatal XID, later a whole node vanishes.
    names = [n["metadata"]["name"] for n in fleet.nodes]
    simulation.xid(monday + timedelta(hours=2 / compress), names[0], gpu_minor=3)
    simulation.node_loss(monday + timedelta(hours=30 / compress), names[-1])


def prepare(seed: int = 0, end: datetime | None = None) -> Simulation:
    """Play the weekend (a few seconds; ending at ``end``, default its fixed 2026-03 dates) and queue the
    live workload mix that follows it."""
    simulation = scenarios.monday_simulation(seed, schedule=allocator_schedule, end=end)
    monday = scenarios.MONDAY_09 + scenarios.monday_shift(end)
    simulation.run(monday)
    queue_week(simulation, seed, monday)
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


def sample_usage(simulation: Simulation, stop: threading.Event, every: float = 10.0) -> None:
    """Sample the simulated GPUs' utilization every ``every`` seconds, from the dcgm-exporter stand-in in
    process: the demo has no Prometheus, but the same sampler, join and tables as production."""
    from simulator import dcgm
    from usage.sampler import sample_cluster
    from usage.tasks import thresholds

    source = dcgm.InProcessSource(lambda: dcgm.cluster_series(simulation.cluster, dcgm.now()))
    try:
        while not stop.wait(every):
            cluster = ingest.get_or_create_cluster(CLUSTER_NAME, "simulated fleet (make demo)")
            sample_cluster(cluster, source, timezone.now(), thresholds())
    except Exception:
        log.exception("demo utilization sampling stopped")
    finally:
        connection.close()


def start(seed: int = 0, speed: float = 60.0, now: datetime | None = None) -> Demo:
    """Replay the weekend ending ``now`` (default the current minute) into the demo cluster, then start the
    streams (one thread per kind) and the live churn; returns a handle to stop them.

    Each run simulates a new cluster whose resourceVersions start over, so the previous run's mirror
    (and its watch cursors and history) is dropped first: resuming from old cursors would freeze the old
    state. The replay leaves every kind's cursor at the weekend's last resourceVersion, so the streams
    watch on from there: no relist, and the live events are observed after the weekend's.
    """
    ingest.drop_cluster(CLUSTER_NAME)
    played = replay.play(seed, end=anchor(now))
    # Hourly diagnoses (as the triage tests) and half-hourly samples keep start-up to seconds; the causes
    # and the allocation chart of a 64-hour weekend need no finer grain.
    cluster = replay.replay(
        played,
        CLUSTER_NAME,
        diagnose_every=timedelta(hours=1),
        sample_every=timedelta(minutes=30),
        description="simulated fleet (make demo)",
    )
    replay.hand_over(cluster, played.simulation.cluster)
    # The live week runs on the real clock (so every timestamp is a real past time, and ages and the
    # history agree with the wall clock), compressed ``speed`` times so something happens every few seconds.
    queue_week(played.simulation, seed, played.end, compress=speed)
    demo = Demo(played.simulation, played.start, played.end)
    for kind in KINDS:
        demo.threads.append(
            threading.Thread(target=_stream, args=(demo, kind), name=f"demo-{kind}", daemon=True)
        )
    demo.threads.append(
        threading.Thread(target=churn, args=(demo.simulation, demo.stop, 1.0), name="demo-churn", daemon=True)
    )
    demo.threads.append(
        threading.Thread(
            target=sample_usage, args=(demo.simulation, demo.stop), name="demo-usage", daemon=True
        )
    )
    for thread in demo.threads:
        thread.start()
    # The allocation history goes on being sampled, every minute as in production, not only over the
    # replayed weekend.
    demo.beat = start_beat()
    demo.threads.append(demo.beat)
    return demo


class DemoScheduler(beat.Scheduler):
    """Celery's in-memory beat scheduler over :data:`BEAT_ENTRIES` of the production schedule only."""

    def setup_schedule(self) -> None:
        schedule = settings.CELERY_BEAT_SCHEDULE
        self.merge_inplace({name: schedule[name] for name in BEAT_ENTRIES})


def start_beat() -> Any:
    """Celery beat, embedded as a thread, on :data:`BEAT_ENTRIES`: the same entries and periods as the
    production beat (the first run one period after start, as there). Without a broker the tasks it sends
    run in this thread (``CELERY_TASK_ALWAYS_EAGER``); returns the started thread (``.service.stop()``)."""
    from dashboard.celery import app

    app.loader.import_default_modules()  # CELERY_IMPORTS, as beat does: an unknown task would be sent away
    thread = beat.EmbeddedService(app, thread=True, scheduler_cls=DemoScheduler)
    thread.start()
    return thread


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
