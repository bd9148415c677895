"""Reading DCGM series: from the Prometheus HTTP API, or from any other ``SeriesSource``.

A round needs, per GPU or MIG instance the exporter reports (an *entity*), the current value of each DCGM
metric. ``PrometheusSource.entities`` asks ``/api/v1/query`` once per metric and lets Prometheus reduce each
series to the labels that identify its entity, joined into one label (``label_join`` + ``max by``): a
series arrives as one short string and a number, which keeps a 40,000-GPU round's answer a few MB per
metric instead of 70 MB of full label sets (decoded, those alone were several hundred MB of Python objects).
Other sources (the simulator's in-process stand-in) return plain ``(metric, labels, value)`` samples, grouped
into entities by ``usage.join.entities``. ``/api/v1/query_range`` serves the charts. Errors (connection
refused, timeout, HTTP or API error) raise :class:`PrometheusUnavailable` with a message naming the server,
so a round can record "unavailable since …" and nothing else breaks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import orjson
import requests

from usage.config import PrometheusConfig

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
POWER = "DCGM_FI_DEV_POWER_USAGE"
METRICS = (ENGINE_ACTIVE, GPU_UTIL, FB_USED, FB_FREE, POWER)
TIMEOUT_SECONDS = 10.0
# The labels that identify an entity (what the join reads), plus the node and model name that make an
# unmatched entity's example readable. Per-workload labels (pod, container, dra_claim_*) are left out: who
# holds a device comes from the allocation mirror, never from the exporter.
ENTITY_LABELS = (
    "UUID",
    "GPU_I_ID",
    "GPU_I_PROFILE",
    "dra_driver_name",
    "dra_pool_name",
    "dra_device_name",
    "dra_mig_device_uuid",
    "Hostname",
    "modelName",
)
ENTITY = "claimscope_entity"  # the label Prometheus joins ENTITY_LABELS into
SEPARATOR = "\x1f"  # ASCII unit separator: appears in no label value the exporter writes


@dataclass(slots=True)
class Entity:
    """One GPU or MIG instance as the exporter reports it: its identifying labels and, per metric, its
    value this round (NaN, DCGM's "no value", is left out: a gap). Slots: a round holds one per GPU or
    MIG instance of the fleet."""

    labels: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EntityRead:
    """What a source answered this round: the entities, how many series they came from, and how long the
    source took to answer (seconds)."""

    entities: list[Entity]
    series: int
    seconds: float


class SampleLike(Protocol):
    """What the join reads of a sample (any source's own type of this shape)."""

    @property
    def metric(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def value(self) -> float: ...


class PrometheusUnavailable(Exception):
    """The source could not answer; the message names the server and why."""


class SeriesSource(Protocol):
    def samples(self) -> tuple[Sequence[SampleLike], float]:
        """Every DCGM sample now, and how long the source took to answer (seconds)."""
        ...


class EntitySource(Protocol):
    def entities(self) -> EntityRead:
        """Every DCGM entity now, with its values (see :class:`EntityRead`)."""
        ...


# Each metric is read in parts, by the last character of the GPU's UUID (hex: even parts): one part's
# answer is what a round holds in memory at a time. The matchers partition every series, one without a
# UUID label included (the last part's negative matcher takes it).
SHARDS = ('UUID=~".*[0-3]"', 'UUID=~".*[4-7]"', 'UUID=~".*[89abAB]"', 'UUID!~".*[0-9abAB]"')


def entity_query(metric: str, matchers: str = "", shard: str = "") -> str:
    """One metric, one series per entity, labelled only by ``ENTITY`` (the joined ``ENTITY_LABELS``).

    ``max by`` folds series that differ only in other labels (target, pod) into one; a metric absent for an
    entity is simply not in the answer. ``shard``: one of ``SHARDS`` (empty: every series).

    (``GPU_UTIL`` is only the fallback of ``ENGINE_ACTIVE``; leaving out in Prometheus the entities that
    have the latter, with ``unless``, spared the round 0.1 s of CPU but cost Prometheus 1-2 s more.)"""
    both = ",".join(m for m in (matchers, shard) if m)
    extra = f"{{{both}}}" if both else ""
    labels = ", ".join(f'"{name}"' for name in ENTITY_LABELS)
    return f'max by ({ENTITY}) (label_join({metric}{extra}, "{ENTITY}", "\\x1f", {labels}))'


def entity_labels(key: str, seen: dict[str, str] | None = None) -> dict[str, str]:
    """``ENTITY_LABELS`` back from a joined key; empty values (labels the series did not have) left out.

    ``seen`` shares equal values between entities (node, pool, model, profile, a MIG instance's parent
    GPU): one string each instead of one per entity, tens of MB on a large fleet."""
    share = ({} if seen is None else seen).setdefault
    return {
        name: share(value, value)
        for name, value in zip(ENTITY_LABELS, key.split(SEPARATOR), strict=False)
        if value
    }


class PrometheusSource:
    """The Prometheus HTTP API of one cluster (see ``usage.config``)."""

    def __init__(self, config: PrometheusConfig, timeout: float = TIMEOUT_SECONDS) -> None:
        self.config = config
        self.timeout = timeout
        self.session = requests.Session()

    def _get(self, path: str, params: dict[str, str]) -> Any:
        # Uncompressed from a server on the cluster's network (``PrometheusConfig.compressed``): a round's
        # answers are ~50 MB at 40,000 GPUs, and inflating them was 0.14 s of a round's 2 s of CPU.
        encoding = "gzip, deflate" if self.config.compressed() else "identity"
        headers = {"Accept": "application/json", "Accept-Encoding": encoding}
        if self.config.token_file:
            try:
                token = Path(self.config.token_file).read_text().strip()
            except OSError as exc:
                raise PrometheusUnavailable(
                    f"cannot read token_file {self.config.token_file}: {exc}"
                ) from exc
            headers["Authorization"] = f"Bearer {token}"
        verify: bool | str = self.config.ca_file or True
        url = f"{self.config.url}{path}"
        try:
            response = self.session.get(
                url, params=params, headers=headers, timeout=self.timeout, verify=verify
            )
        except requests.RequestException as exc:
            raise PrometheusUnavailable(f"{self.config.url}: {type(exc).__name__}: {exc}") from exc
        try:
            # orjson: a round's answer is tens of MB of JSON on a large fleet, parsed several times faster.
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise PrometheusUnavailable(f"{url}: HTTP {response.status_code}, not JSON") from None
        if response.status_code != 200 or body.get("status") != "success":
            why = f"{body.get('errorType', '')} {body.get('error', '')}".strip()
            raise PrometheusUnavailable(f"{url}: HTTP {response.status_code}: {why}")
        return body["data"]

    def entities(
        self, matchers: str = "", metrics: Sequence[str] = METRICS, shards: Sequence[str] = SHARDS
    ) -> EntityRead:
        """Every entity's values: one query per metric and shard, each answer turned into entities and
        dropped before the next is read (a round's peak memory is one part of one metric's answer).
        ``matchers``: PromQL label matchers added to the configured ones (a chart's few GPUs)."""
        grouped: dict[str, Entity] = {}
        seen: dict[str, str] = {}
        series = 0
        took = 0.0
        both = ",".join(m for m in (self.config.matchers(), matchers) if m)
        for metric, shard in ((m, part) for m in metrics for part in shards):
            started = time.monotonic()
            query = entity_query(metric, both, shard)
            data = self._get("/api/v1/query", {"query": query})
            took += time.monotonic() - started
            if data.get("resultType") != "vector":
                raise PrometheusUnavailable(
                    f"{self.config.url}: expected a vector, got {data.get('resultType')}"
                )
            find = grouped.get
            rows = data["result"]
            gaps = 0
            for row in rows:
                value = float(row["value"][1])
                if value != value:  # NaN, what DCGM reports for "no value": a gap, not a number
                    gaps += 1
                    continue
                key = row["metric"].get(ENTITY, "")
                entity = find(key)
                if entity is None:
                    entity = grouped[key] = Entity(entity_labels(key, seen))
                entity.values[metric] = value
            series += len(rows) - gaps
            del data, rows
        return EntityRead(list(grouped.values()), series, took)

    def range(
        self, query: str, start: datetime, end: datetime, step_seconds: int
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """``/api/v1/query_range``: (labels, [(unix time, value)]) per series; missing steps stay missing."""
        data = self._get(
            "/api/v1/query_range",
            {
                "query": query,
                "start": f"{start.timestamp():.3f}",
                "end": f"{end.timestamp():.3f}",
                "step": str(step_seconds),
            },
        )
        return [
            (dict(row["metric"]), [(float(t), float(v)) for t, v in row["values"]]) for row in data["result"]
        ]
