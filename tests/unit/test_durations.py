"""Duration parameters of the API (``?older_than=``, ``?age=``): parsed, capped, never an overflow."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.api.base import MAX_DURATION, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90", timedelta(seconds=90)), ("15m", timedelta(minutes=15)), ("2h", timedelta(hours=2)),
     ("3d", timedelta(days=3)), ("1w", timedelta(weeks=1))],
)  # fmt: skip
def test_units(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_a_huge_number_is_capped_instead_of_overflowing() -> None:
    # timedelta(weeks=999999999) raises OverflowError: that was a 500 on /api/v1/leaks/?older_than=...
    assert parse_duration("999999999w") == MAX_DURATION


def test_a_malformed_duration_names_the_value() -> None:
    with pytest.raises(ValueError, match="'2 hours' is not a duration"):
        parse_duration("2 hours")
