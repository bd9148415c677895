"""The last hours of a GPU's, a node's or a claim's utilization, from Prometheus (``query_range``), as chart
traces: graphics-engine activity and framebuffer use in percent, one trace per GPU or MIG instance.

Steps without a sample are None (drawn as gaps, never as 0 %). The series stay in Prometheus; nothing is
stored here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from usage.config import PrometheusConfig
from usage.prometheus import ENGINE_ACTIVE, FB_FREE, FB_USED, GPU_UTIL, PrometheusSource

POINTS = 288  # a 24-hour chart at 5-minute steps


@dataclass
class Traces:
    activity: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def matchers(config: PrometheusConfig, labels: dict[str, str], uuids: list[str] | None = None) -> str:
    """PromQL label matchers for the configured labels, exact labels, and optionally a set of GPU UUIDs."""
    parts = [f'{k}="{_quote(v)}"' for k, v in (*config.labels, *labels.items())]
    if uuids is not None:
        # UUIDs are hex and dashes; anything else is dropped rather than interpolated into a regex.
        safe = sorted({u for u in uuids if u and all(c.isalnum() or c == "-" for c in u)})
        parts.append(f'UUID=~"{"|".join(safe) or "none"}"')
    return ",".join(parts)


def _name(labels: dict[str, str]) -> str:
    name = f"{labels.get('Hostname', '')} GPU {labels.get('gpu', '?')}".strip()
    if labels.get("GPU_I_PROFILE"):
        name += f" {labels['GPU_I_PROFILE']} #{labels.get('GPU_I_ID', '?')}"
    return name


def _grid(start: datetime, step: int, points: int, values: list[tuple[float, float]]) -> list[float | None]:
    at = {round(t): v for t, v in values}
    first = round(start.timestamp())
    return [at.get(first + i * step) for i in range(points)]


def traces(source: PrometheusSource, selector: str, end: datetime, hours: int = 24) -> Traces:
    """Activity and memory traces of the series ``selector`` matches (may raise PrometheusUnavailable)."""
    step = max(60, hours * 3600 // POINTS)
    end = end.replace(microsecond=0)  # whole seconds: the grid's times match Prometheus's step times
    start = end - timedelta(seconds=step * (POINTS - 1))
    times = [(start + timedelta(seconds=step * i)).isoformat() for i in range(POINTS)]
    out = Traces()
    activity = f"100 * {ENGINE_ACTIVE}{{{selector}}} or {GPU_UTIL}{{{selector}}}"
    memory = f"100 * {FB_USED}{{{selector}}} / ({FB_USED}{{{selector}}} + {FB_FREE}{{{selector}}})"
    for query, into in ((activity, out.activity), (memory, out.memory)):
        for labels, values in sorted(source.range(query, start, end, step), key=lambda r: _name(r[0])):
            into.append({"name": _name(labels), "x": times, "y": _grid(start, step, POINTS, values)})
    return out
