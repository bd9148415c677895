"""Allocation history: the beat task samples every minute; old minutes fold into hours, old hours expire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.models import AllocationSample
from fleet.tasks.history import downsample_history, sample_allocation
from tests.api.conftest import all_rows

T0 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


@pytest.mark.usefixtures("fixture_fleet")
def test_a_sample_records_partition_aware_gpu_slices_and_mig_profiles(api):
    sample_allocation(T0.isoformat())
    rows = all_rows(api, "/api/v1/history/", model="H200")
    by_profile = {r["profile"]: r for r in rows}
    assert by_profile[""]["total"] == 56 and by_profile[""]["allocated"] == 9  # EXPECTED compute_slices
    assert by_profile["3g.71gb"]["total"] == 16 and by_profile["3g.71gb"]["allocated"] == 3
    assert {r["time"] for r in rows} == {"2026-01-01T10:00:00Z"}


@pytest.mark.usefixtures("fixture_fleet")
def test_sampling_twice_in_a_minute_keeps_one_point():
    sample_allocation(T0.isoformat())
    first = AllocationSample.objects.count()
    sample_allocation((T0 + timedelta(seconds=30)).isoformat())
    assert AllocationSample.objects.count() == first


@pytest.mark.usefixtures("fixture_fleet")
def test_minutes_older_than_30_days_become_hourly_averages(api):
    for minute in range(3):
        sample_allocation((T0 + timedelta(minutes=minute)).isoformat())
    AllocationSample.objects.filter(time=T0, profile="").update(allocated=0)
    groups = AllocationSample.objects.filter(time=T0).count()
    downsample_history((T0 + timedelta(days=31)).isoformat())
    assert not AllocationSample.objects.filter(resolution="minute").exists()
    hourly = AllocationSample.objects.filter(resolution="hour")
    assert hourly.count() == groups and {p.time for p in hourly} == {T0}
    h200 = hourly.get(model="H200", profile="")
    assert h200.allocated == pytest.approx(9 * 2 / 3)
    rows = all_rows(api, "/api/v1/history/", resolution="hour", model="H200", profile="3g.71gb")
    assert len(rows) == 1 and rows[0]["allocated"] == 3


@pytest.mark.usefixtures("fixture_fleet")
def test_recent_minutes_stay_and_hours_older_than_a_year_expire():
    sample_allocation(T0.isoformat())
    downsample_history((T0 + timedelta(days=29)).isoformat())
    assert AllocationSample.objects.filter(resolution="minute").exists()
    downsample_history((T0 + timedelta(days=31)).isoformat())
    assert AllocationSample.objects.filter(resolution="hour").exists()
    downsample_history((T0 + timedelta(days=366)).isoformat())
    assert not AllocationSample.objects.exists()


@pytest.mark.usefixtures("fixture_fleet")
def test_history_filters_by_time_window(api):
    for minute in range(5):
        sample_allocation((T0 + timedelta(minutes=minute)).isoformat())
    rows = all_rows(
        api,
        "/api/v1/history/",
        model="B200",
        profile="gpu",
        since="2026-01-01T10:01:00Z",
        until="2026-01-01T10:03:00Z",
    )
    assert [r["time"] for r in rows] == ["2026-01-01T10:01:00Z", "2026-01-01T10:02:00Z"]


def test_the_beat_schedule_runs_the_history_tasks():
    from django.conf import settings

    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"fleet.tasks.history.sample_allocation", "fleet.tasks.history.downsample_history"} <= tasks
    assert "fleet.tasks.history" in settings.CELERY_IMPORTS


@pytest.mark.usefixtures("fixture_fleet")
def test_history_pages_by_time_in_both_directions(api):
    for minute in range(4):
        sample_allocation((T0 + timedelta(minutes=minute)).isoformat())
    forward = all_rows(api, "/api/v1/history/", model="B200", profile="gpu", page_size=1)
    backward = all_rows(api, "/api/v1/history/", model="B200", profile="gpu", page_size=1, ordering="-time")
    assert [r["time"] for r in forward] == [r["time"] for r in reversed(backward)]
    assert len(forward) == 4
