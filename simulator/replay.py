"""Replay the ``monday`` scenario into the database through ``fleet.ingest``, at its simulated times.

The simulator's history holds every watch event in order but not when it happened, so the simulation is run
with its cluster wrapped in :class:`ClockedCluster`, which notes the simulated time of every write by the
resourceVersion it produced. The events are then ingested in order, each run of same-kind events at one
instant as one batch observed at that instant, with the diagnosis task and the allocation sampler run on
the simulated clock in between (as beat and the change trigger would have run them over the weekend).

The demo replays the weekend anchored to end now, then hands the cluster over to live reflectors
(:func:`hand_over`), so its claim history, causes and allocation samples are the weekend's own. The triage
tests replay it at its fixed dates.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from claims.tasks import recompute_diagnoses
from fleet import ingest
from fleet.models import Cluster
from fleet.normalize import KINDS, is_stored, normalize
from fleet.tasks.history import sample_allocation
from simulator import scenarios
from simulator.cluster import SimulatedCluster
from simulator.scheduling_allocator import allocator_schedule
from simulator.workloads import Simulation

Obj = dict[str, Any]
CLUSTER = "monday"


class ClockedCluster:
    """A SimulatedCluster that remembers the simulated time of each write (by resourceVersion)."""

    def __init__(self, inner: SimulatedCluster, simulation: Simulation) -> None:
        self._inner = inner
        self._simulation = simulation
        self.times: dict[int, datetime] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _noted(self, obj: Obj) -> Obj:
        self.times[int(obj["metadata"]["resourceVersion"])] = self._simulation.now
        return obj

    def create(self, obj: Obj) -> Obj:
        return self._noted(self._inner.create(obj))

    def update(self, obj: Obj) -> Obj:
        return self._noted(self._inner.update(obj))

    def apply(self, obj: Obj) -> Obj:
        return self._noted(self._inner.apply(obj))

    def delete(self, kind: str, namespace: str | None, name: str) -> Obj:
        return self._noted(self._inner.delete(kind, namespace, name))

    def bulk_create(self, objs: Any) -> None:
        for obj in objs:
            self.create(obj)


@dataclass
class Played:
    """The played weekend: the simulation at its Monday 09:00 and every watch event with its simulated time.

    ``start`` and ``end`` are the weekend's Friday 17:00 and Monday 09:00 (the fixed 2026-03 dates unless
    the scenario was anchored)."""

    simulation: Simulation
    events: list[tuple[datetime, Obj]]
    start: datetime = scenarios.FRIDAY_17
    end: datetime = scenarios.MONDAY_09


def play(seed: int = 0, end: datetime | None = None) -> Played:
    """The monday scenario (allocator replay as scheduler, as in the demo), each event with its time.

    ``end`` anchors the weekend to end then (see ``scenarios.monday_simulation``); default its fixed dates."""
    shift = scenarios.monday_shift(end)
    start, end = scenarios.FRIDAY_17 + shift, scenarios.MONDAY_09 + shift
    simulation = scenarios.monday_simulation(seed, schedule=allocator_schedule, end=end)
    inner = simulation.cluster
    clocked = ClockedCluster(inner, simulation)
    simulation.cluster = clocked  # type: ignore[assignment]  # same interface, writes noted
    try:
        simulation.run(end)
    finally:
        simulation.cluster = inner
    events = []
    for event in inner.history():
        rv = int(event["object"]["metadata"]["resourceVersion"])
        # Writes before the wrapper (the fleet itself) happened at the start.
        events.append((clocked.times.get(rv, start), event))
    return Played(simulation, events, start, end)


def _batches(events: list[tuple[datetime, Obj]]) -> Iterator[tuple[datetime, str, list[ingest.Change]]]:
    """Runs of events of one kind at one instant, as ingest changes (filtered as the reflector does)."""
    run: list[ingest.Change] = []
    key: tuple[datetime, str] | None = None
    for at, event in events:
        obj = event["object"]
        kind = obj["kind"]
        if key is not None and key != (at, kind) and run:
            yield key[0], key[1], run
            run = []
        key = (at, kind)
        if event["type"] != "DELETED" and not is_stored(kind, obj):
            continue
        op = "delete" if event["type"] == "DELETED" else "upsert"
        run.append(ingest.Change(op, normalize(kind, obj)))  # type: ignore[arg-type]
    if key is not None and run:
        yield key[0], key[1], run


@contextmanager
def _unannounced() -> Iterator[None]:
    """Ingest without change events: nobody follows a replay live, and the change trigger's diagnosis would
    run at the wall clock's time (the replay runs it on the simulated clock itself).

    It swaps ingest's listener list for the duration, process-wide: replay before anything else ingests in
    this process (the demo replays before its streams and server start)."""
    listeners, publish = ingest.events._listeners[:], ingest.events.publish
    ingest.events._listeners.clear()
    ingest.events.publish = lambda event: None  # _notify looks it up at call time
    try:
        yield
    finally:
        ingest.events._listeners[:] = listeners
        ingest.events.publish = publish


def replay(
    played: Played,
    cluster_name: str = CLUSTER,
    diagnose_every: timedelta = timedelta(minutes=30),
    sample_every: timedelta = timedelta(minutes=15),
    description: str = "the monday scenario, replayed",
) -> Cluster:
    """Ingest every event at its simulated time; diagnose and sample on the simulated clock."""
    cluster = ingest.get_or_create_cluster(cluster_name, description)
    next_diagnosis, next_sample = played.start, played.start

    def tick(until: datetime, inclusive: bool) -> None:
        nonlocal next_diagnosis, next_sample
        while next_sample < until or (inclusive and next_sample == until):
            sample_allocation(next_sample.isoformat())
            next_sample += sample_every
        while next_diagnosis < until or (inclusive and next_diagnosis == until):
            recompute_diagnoses(cluster_name, next_diagnosis.isoformat())
            next_diagnosis += diagnose_every

    # One transaction around it all: a replay is one import (readers see the weekend whole or not at all),
    # and SQLite (the demo) commits once instead of ~2,000 times. Inside _unannounced, so the batches'
    # change events, deferred to that commit, are dropped too.
    with _unannounced(), transaction.atomic():
        for at, kind, changes in _batches(played.events):
            tick(at, inclusive=False)  # a tick at exactly `at` comes after that instant's events
            ingest.apply_batch(cluster, kind, changes, observed_at=at)
        tick(played.end, inclusive=True)
    return cluster


def hand_over(cluster: Cluster, source: SimulatedCluster) -> int:
    """Save every kind's watch cursor at the replayed cluster's resourceVersion; returns that version.

    Reflectors started afterwards resume watching from there (``Reflector.round`` uses a stored cursor in
    state "watching") instead of relisting, so the live stream continues the replayed weekend."""
    rv = int(source.resource_version)
    for kind in KINDS:
        count = sum(1 for obj in source.objects(kind) if is_stored(kind, obj))
        ingest.apply_batch(cluster, kind, [], cursor=ingest.CursorUpdate(rv, "watching", objects=count))
    return rv
