"""The last hours of a GPU's, a node's or a claim's utilization, from Prometheus (``query_range``), as chart
traces: graphics-engine activity and framebuffer use in percent, one trace per GPU or MIG instance.

Steps without a sample are None (drawn as gaps, never as 0 %). The series stay in Prometheus; nothing is
stored here. A claim's series are those with its DRA labels plus the exporter entities its devices match
now (:func:`usage.sampler.claim_instances`): dynamic-MIG series carry no DRA labels.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
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


def instance_matchers(config: PrometheusConfig, instances: Iterable[tuple[str, str]]) -> list[str]:
    """Matchers of exactly these (GPU UUID, GPU_I_ID) entities (``GPU_I_ID`` empty: a whole GPU): one per
    instance id, naming the GPUs whose instance of that id is wanted, so that every (UUID, id) pair the
    matcher admits is one of ``instances``."""
    by_id: dict[str, set[str]] = defaultdict(set)
    for uuid, instance in instances:
        if uuid and all(c.isalnum() or c == "-" for c in uuid) and (instance.isdigit() or not instance):
            by_id[instance].add(uuid)
    return [
        matchers(config, {"GPU_I_ID": instance}) + f',UUID=~"(?i){"|".join(sorted(uuids))}"'
        for instance, uuids in sorted(by_id.items())
    ]


def claim_matchers(
    config: PrometheusConfig, namespace: str, claim: str, instances: Iterable[tuple[str, str]]
) -> list[str]:
    """The series of a claim: its DRA labels, or one of the entities its devices match now."""
    labels = {"dra_claim_namespace": namespace, "dra_claim_name": claim}
    return [matchers(config, labels), *instance_matchers(config, instances)]


def _name(labels: dict[str, str]) -> str:
    name = f"{labels.get('Hostname', '')} GPU {labels.get('gpu', '?')}".strip()
    if labels.get("GPU_I_PROFILE"):
        name += f" {labels['GPU_I_PROFILE']} #{labels.get('GPU_I_ID', '?')}"
    return name


def _grid(start: datetime, step: int, points: int, values: list[tuple[float, float]]) -> list[float | None]:
    at = {round(t): v for t, v in values}
    first = round(start.timestamp())
    return [at.get(first + i * step) for i in range(points)]


def traces(source: PrometheusSource, selector: str | Sequence[str], end: datetime, hours: int = 24) -> Traces:
    """Activity and memory traces of the series ``selector`` matches, or any of several selectors (a
    series two of them match is charted once). May raise PrometheusUnavailable."""
    selectors = [selector] if isinstance(selector, str) else list(selector)
    step = max(60, hours * 3600 // POINTS)
    end = end.replace(microsecond=0)  # whole seconds: the grid's times match Prometheus's step times
    start = end - timedelta(seconds=step * (POINTS - 1))
    times = [(start + timedelta(seconds=step * i)).isoformat() for i in range(POINTS)]
    out = Traces()
    # ``or`` keeps a series of the left side over one with the same labels on the right (the metric name
    # aside): an entity's engine activity over its GPU_UTIL, and a series two selectors match once.
    activity = " or ".join(f"100 * {ENGINE_ACTIVE}{{{s}}} or {GPU_UTIL}{{{s}}}" for s in selectors)
    memory = " or ".join(f"100 * {FB_USED}{{{s}}} / ({FB_USED}{{{s}}} + {FB_FREE}{{{s}}})" for s in selectors)
    for query, into in ((activity, out.activity), (memory, out.memory)):
        for labels, values in sorted(source.range(query, start, end, step), key=lambda r: _name(r[0])):
            into.append({"name": _name(labels), "x": times, "y": _grid(start, step, POINTS, values)})
    return out
