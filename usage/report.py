"""The idle-allocations report: one function behind the page, the API and ``manage.py idle``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.api.base import parse_duration
from fleet.models import Cluster
from usage import selectors

SECTIONS = ("claims", "waste")


class WindowError(ValueError):
    """A window parameter we cannot read; ``parameter`` names it."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


def parse_when(parameter: str, value: str, now: datetime) -> datetime:
    """ISO 8601 (no offset: UTC), a duration before ``now`` (``24h``, ``7d``), or ``now``. For ``since``,
    ``now`` is the window's end."""
    text = value.strip()
    if text == "now":
        return now
    try:
        # A unit is required ("24h", not "24"): a bare number is no date-time and no clear duration.
        if text[-1:].isalpha():
            return now - parse_duration(text)
    except ValueError:
        pass
    except OverflowError:
        raise WindowError(parameter, f"{value!r} reaches before year 1") from None
    try:
        when = parse_datetime(text)
    except ValueError:
        when = None
    if when is None:
        raise WindowError(parameter, f"{value!r} is neither ISO 8601, a duration ago (24h, 7d) nor 'now'")
    if not timezone.is_aware(when):
        return when.replace(tzinfo=UTC)
    try:
        # In UTC: PostgreSQL refuses offsets beyond ±15:59, which ISO 8601 strings may carry.
        return when.astimezone(UTC)
    except OverflowError:
        raise WindowError(parameter, f"{value!r} is out of range") from None


def window(since: str | None, until: str | None, now: datetime) -> tuple[datetime, datetime]:
    """The (start, end) of a report: ``until`` default now, ``since`` default 24 hours before it."""
    end = parse_when("until", until, now) if until else now
    try:
        start = parse_when("since", since, end) if since else end - timedelta(hours=24)
    except OverflowError:
        raise WindowError("since", "the window would start before year 1") from None
    if start > end:
        raise WindowError("since", "is after until")
    return start, end


def parse_below(value: str | None) -> float:
    if value is None or value == "":
        return float(settings.CLAIMSCOPE_IDLE_BELOW_PERCENT)
    try:
        below = float(value)
    except ValueError:
        raise WindowError("below", f"{value!r} is not a number (a percentage, 0-100)") from None
    if not 0 <= below <= 100:
        raise WindowError("below", f"{value!r} is not a percentage between 0 and 100")
    return below


def idle_report(
    since: str | None = None,
    until: str | None = None,
    below: str | None = None,
    cluster: str | None = None,
    visible: Q | None = None,
    now: datetime | None = None,
    allows: Callable[[str, str], bool] | None = None,
) -> dict[str, Any]:
    """Claims that held GPUs idle in the window (default: the last 24 hours), the idle GPU-hours per
    namespace and model, and since when utilization has been unavailable (None when it is not)."""
    now = now or timezone.now()
    start, end = window(since, until, now)
    below_percent = parse_below(below)
    idle_window = timedelta(minutes=settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES)
    cluster_ids = None
    if cluster:
        cluster_ids = list(Cluster.objects.filter(name=cluster).values_list("pk", flat=True))
    claims = selectors.idle_claims(start, end, below_percent, idle_window, cluster_ids, visible)
    selectors.add_blocked(claims, idle_window, allows)
    unavailable = selectors.unavailable_since(cluster_ids)
    return {
        "window": {
            "since": start,
            "until": end,
            "cluster": cluster or None,
            "below_percent": below_percent,
            "idle_window_minutes": settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES,
        },
        "unavailable_since": unavailable,
        "claims": [asdict(c) for c in claims],
        "waste": [asdict(w) for w in selectors.waste(claims)],
    }


def section_rows(report: dict[str, Any], section: str) -> list[dict[str, Any]]:
    """One list of the report, for CSV."""
    return list(report[section])


def hours_text(hours: float) -> str:
    return f"{hours:.1f}"


def text(report: dict[str, Any]) -> str:
    """The report as plain text (``manage.py idle``)."""
    w = report["window"]
    lines = [
        f"Idle allocations {w['since']:%Y-%m-%d %H:%M} -> {w['until']:%Y-%m-%d %H:%M} UTC "
        f"(below {w['below_percent']:g} %, idle for {w['idle_window_minutes']} min)"
    ]
    if report["unavailable_since"]:
        lines.append(f"utilization unavailable since {report['unavailable_since']:%Y-%m-%d %H:%M} UTC")
    if not report["claims"]:
        lines.append("No claim held GPUs idle.")
    for c in report["claims"]:
        mean = "no samples" if c["mean_active_percent"] is None else f"mean {c['mean_active_percent']:.1f} %"
        since = f", idle since {c['idle_since']:%Y-%m-%d %H:%M}" if c["idle_since"] else ""
        held = f"{c['gpus']:g} {c['model']}{' ' + c['profile'] if c['profile'] else ''}"
        idle_hours = c["idle_gpu_hours"] / c["gpus"] if c["gpus"] else 0.0
        waited = f" while {c['blocked']} claims waited for {c['model']}" if c["blocked"] else ""
        lines.append(
            f"{held} idle for {hours_text(idle_hours)} h held by {c['namespace']}/{c['claim']} "
            f"({c['cluster']}){waited}: {hours_text(c['idle_gpu_hours'])} GPU-hours idle, {mean}{since}"
        )
    if report["waste"]:
        lines.append("")
        lines.append("Idle GPU-hours per namespace and model:")
        for x in report["waste"]:
            lines.append(
                f"  {x['namespace']:<30} {x['model']:<8} {hours_text(x['idle_gpu_hours']):>8}"
                f"  ({x['claims']} claims)"
            )
    return "\n".join(lines) + "\n"
