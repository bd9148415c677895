"""The demo's live week, played without the database: it behaves like a week compressed onto the real clock.

The pods still pending when the weekend ends (the finetunes behind the pretraining jobs, the 1g pods behind
the all-1g pool) get placed once the weekend's long jobs end, and the queue drains as well as grows."""

from datetime import UTC, datetime, timedelta
from itertools import pairwise

from simulator import demo, scenarios
from simulator.scheduling_allocator import allocator_schedule
from simulator.workloads import Simulation

END = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)  # a Thursday morning, as the demo may start any time
SPEED = 60  # the demo's default


def pending(simulation: Simulation) -> set[tuple[str, str]]:
    return {
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in simulation.cluster.objects("Pod")
        if not p["spec"].get("nodeName")
    }


def test_the_weekends_pending_pods_are_placed_and_the_queue_drains_during_the_live_week():
    simulation = scenarios.monday_simulation(0, schedule=allocator_schedule, end=END)
    simulation.run(END)
    at_start = pending(simulation)
    assert len(at_start) >= 10, at_start  # the weekend's story: finetunes and 1g pods wait
    demo.queue_week(simulation, 0, END, compress=SPEED)
    counts = []
    for minute in range(1, 41):  # 40 real minutes: the week's first 40 hours
        simulation.run(END + timedelta(minutes=minute))
        counts.append(len(pending(simulation)))
    placed = at_start - pending(simulation)
    # Pods that waited over the weekend got devices once the 90 h pretraining jobs ended (Tuesday noon of
    # the week, 27 real minutes in), not only pods that arrived to free devices.
    assert {name for _, name in placed} & {f"finetune-{i}-0" for i in range(9)}, placed
    assert any(later < earlier for earlier, later in pairwise(counts)), counts
    assert any(later > earlier for earlier, later in pairwise(counts)), counts
    # The queue is bounded by what the fleet serves: it does not grow by the minute.
    assert counts[-1] < 3 * len(at_start), counts
