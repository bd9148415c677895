"""Reading DCGM series: from the Prometheus HTTP API, or from any other ``SeriesSource``.

A source returns the current value of every DCGM series the sampler needs as ``(metric, labels, value)``;
``PrometheusSource`` asks ``/api/v1/query`` for all of them in one query and ``/api/v1/query_range`` for
charts. Errors (connection refused, timeout, HTTP or API error) raise :class:`PrometheusUnavailable`
with a message naming the server, so a round can record "unavailable since …" and nothing else breaks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Sample:
    """One series' current value."""

    metric: str
    labels: Mapping[str, str]
    value: float


class SampleLike(Protocol):
    """What the join reads of a sample (``Sample``, or any source's own type of the same shape)."""

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


def selector(metrics: tuple[str, ...], matchers: str = "") -> str:
    """``{__name__=~"A|B", extra}``: one query for several metric names."""
    names = "|".join(metrics)
    extra = f",{matchers}" if matchers else ""
    return f'{{__name__=~"{names}"{extra}}}'


class PrometheusSource:
    """The Prometheus HTTP API of one cluster (see ``usage.config``)."""

    def __init__(self, config: PrometheusConfig, timeout: float = TIMEOUT_SECONDS) -> None:
        self.config = config
        self.timeout = timeout
        self.session = requests.Session()

    def _get(self, path: str, params: dict[str, str]) -> Any:
        headers = {"Accept": "application/json"}
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

    def samples(self) -> tuple[list[Sample], float]:
        started = time.monotonic()
        data = self._get("/api/v1/query", {"query": selector(METRICS, self.config.matchers())})
        took = time.monotonic() - started
        if data.get("resultType") != "vector":
            raise PrometheusUnavailable(f"{self.config.url}: expected a vector, got {data.get('resultType')}")
        out: list[Sample] = []
        for row in data["result"]:
            labels = dict(row["metric"])
            value = float(row["value"][1])
            if math.isnan(value):  # NaN is what DCGM reports for "no value": a gap, not a number
                continue
            out.append(Sample(labels.pop("__name__", ""), labels, value))
        return out, took

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
