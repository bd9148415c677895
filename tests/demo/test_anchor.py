"""The monday scenario anchored in time (the demo's weekend ends at its start): the same story, moved."""

from datetime import UTC, datetime, timedelta

import pytest

from simulator import demo, scenarios
from simulator.management.commands.demo import triage_line

END = datetime(2026, 12, 2, 14, 37, tzinfo=UTC)  # a Wednesday: the anchor is any time, not a Monday
SHIFT = END - scenarios.MONDAY_09


def test_the_shifted_timeline_is_the_same_weekend_later():
    fixed = scenarios.monday_workloads(0)
    moved = scenarios.monday_workloads(0, SHIFT)
    assert [(w.namespace, w.name, w.arrival + SHIFT, w.duration) for w in fixed] == [
        (w.namespace, w.name, w.arrival, w.duration) for w in moved
    ]
    assert scenarios.monday_workloads(0, timedelta(0)) == fixed  # the default is the fixed 2026-03 dates


def test_an_anchored_simulation_starts_64_hours_before_its_end():
    assert scenarios.monday_shift(None) == timedelta(0)
    assert scenarios.monday_shift(END) == SHIFT
    simulation = scenarios.monday_simulation(0, end=END)
    assert simulation.now == END - (scenarios.MONDAY_09 - scenarios.FRIDAY_17)
    assert scenarios.monday_simulation(0).now == scenarios.FRIDAY_17


def test_an_anchor_without_time_zone_is_refused():
    with pytest.raises(ValueError, match="has no time zone"):
        scenarios.monday_shift(datetime(2026, 12, 2, 9, 0))


def test_the_demo_anchors_its_weekend_to_the_current_minute():
    assert demo.anchor(datetime(2026, 12, 2, 14, 37, 59, 999, tzinfo=UTC)) == END


def test_the_live_week_is_compressed_onto_the_real_clock():
    # The demo's live week: 60 times denser and shorter, so that it runs on the real clock (timestamps
    # never ahead of now) and still changes something every few seconds.
    simulation = scenarios.monday_simulation(0, end=END)
    queued: list = []
    simulation.submit = queued.append  # type: ignore[method-assign,assignment]
    demo.queue_week(simulation, 0, END, compress=60)
    # The whole week (int() of a float product may drop one).
    assert len(queued) >= 24 * 7 * demo.WEEK_ARRIVALS_PER_HOUR - 1
    assert all(END <= w.arrival <= END + timedelta(hours=24 * 7 / 60) for w in queued)
    assert max(w.duration for w in queued if w.duration is not None) == timedelta(hours=24 / 60)


def test_the_start_up_line_names_the_replayed_window_by_its_real_days_and_links_exactly_it():
    # Started on a Thursday, the replayed weekend ran Monday evening to Thursday morning: the line must not
    # call that a weekend, and the link's window is the printed one (not running on into the live week).
    thursday = datetime(2026, 12, 3, 8, 27, tzinfo=UTC)
    weekend_start = thursday - (scenarios.MONDAY_09 - scenarios.FRIDAY_17)
    since = demo.Demo(None, weekend_start, thursday).triage_since  # type: ignore[arg-type]
    line = triage_line("http://127.0.0.1:8000/", since, thursday)
    assert "weekend triage" not in line
    assert "the 63 h replayed before start-up" in line
    assert "Mon 2026-11-30 17:27 to Thu 2026-12-03 08:27 UTC" in line
    assert line.endswith(
        ": http://127.0.0.1:8000/claims/triage/?since=2026-11-30T17:27Z&until=2026-12-03T08:27Z"
    )
