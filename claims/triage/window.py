"""The triage report's window: parse ``since``/``until`` texts, the default window, durations as text.

Window default (decided here, documented in the README): on Saturday, Sunday and Monday the report starts
at the last Friday 18:00 (the weekend so far), on other days it covers the last 24 hours; it ends now. Times
without an offset are in the server's TIME_ZONE.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo


class WindowError(ValueError):
    """A bad ``since``/``until``: the message names the parameter and the accepted forms."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


# ------------------------------------------------------------------------------------------- window

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY = re.compile(r"^\s*(?:last\s+)?([a-z]+)(?:\s+(\d{1,2}):(\d{2}))?\s*$", re.IGNORECASE)
_AGO = re.compile(r"^\s*(\d{1,6})\s*([mhdw])(?:\s+ago)?\s*$", re.IGNORECASE)
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
FORMS = (
    "an ISO 8601 time (2026-03-06T18:00:00Z, 2026-03-06 18:00), a weekday with a time "
    "('friday 18:00': the last one before the report's end), a duration ago (24h, 3d) or 'now'"
)


def parse_when(text: str, parameter: str, reference: datetime, tz: ZoneInfo) -> datetime:
    """One window end from ``text``; relative forms count back from ``reference``. Raises WindowError.

    Hand-written rather than dateutil/dateparser: neither reads "friday 18:00" as the *last* Friday, which
    is what a triage means, and the accepted forms must be exact (a typo is an error, not a guess)."""
    value = text.strip()
    if not value:
        raise WindowError(parameter, f"must not be empty; give {FORMS}")
    if value.lower() == "now":
        return reference
    ago = _AGO.match(value)
    if ago:
        try:
            return reference - timedelta(seconds=int(ago[1]) * _UNITS[ago[2].lower()])
        except OverflowError:
            raise WindowError(parameter, f"{text[:60]!r} reaches before year 1") from None
    day = _WEEKDAY.match(value)
    if day and day[1].lower() in WEEKDAYS:
        local = reference.astimezone(tz)
        hour, minute = (int(day[2]), int(day[3])) if day[2] else (0, 0)
        if hour > 23 or minute > 59:
            raise WindowError(parameter, f"{text!r} has no such time of day")
        back = (local.weekday() - WEEKDAYS.index(day[1].lower())) % 7
        at = (local - timedelta(days=back)).replace(hour=hour, minute=minute, second=0, microsecond=0)
        if at > local:
            at -= timedelta(days=7)
        return at.astimezone(UTC)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise WindowError(parameter, f"{text[:60]!r} is not a time: give {FORMS}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise WindowError(parameter, f"{text[:60]!r} is out of range") from None


def default_window(now: datetime, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """Saturday to Monday: since the last Friday 18:00; other days: the last 24 hours."""
    local = now.astimezone(tz)
    if local.weekday() in (5, 6, 0):
        return parse_when("friday 18:00", "since", now, tz), now
    return now - timedelta(hours=24), now


def window(
    since: str | None, until: str | None, now: datetime, tz: ZoneInfo
) -> tuple[datetime, datetime, bool]:
    """The report's window from optional texts (relative ``since`` counts back from ``until``), and whether
    it is the default one. Raises WindowError."""
    end = parse_when(until, "until", now, tz) if until is not None else now
    try:
        start = default_window(end, tz)[0] if since is None else parse_when(since, "since", end, tz)
    except OverflowError:  # counting back from an `until` at the start of year 1
        raise WindowError("since", "out of range") from None
    if start >= end:
        raise WindowError("since", f"{start.isoformat()} is not before until {end.isoformat()}")
    return start, end, since is None and until is None


def duration_text(seconds: float) -> str:
    """``2d 14h 05m``, ``3h 20m``, ``45s``: how long, as on-call reads it."""
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"
