"""Fleet view filters: parsed once from a query string, shared by pages and the websocket feed.

Every view is a permalink: :meth:`FleetFilter.query` writes the filters back as a query string. A bad value
raises :class:`FilterError` naming the parameter, which views turn into a 400 and the feed into a refusal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

STATES = ("free", "allocated", "reserved", "tainted", "unavailable")
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_LABEL_KEY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9.-]{0,252}/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][A-Za-z0-9._-]{0,61})?[A-Za-z0-9])?$")
PARAMETERS = ("cluster", "model", "pool", "label", "state")


class FilterError(ValueError):
    """A filter parameter has a value we cannot use."""

    def __init__(self, parameter: str, problem: str) -> None:
        super().__init__(f"{parameter}: {problem}")
        self.parameter = parameter


@dataclass(frozen=True)
class FleetFilter:
    """cluster name, model family, DRA pool, one node label ``key=value`` (or ``key``), device state."""

    cluster: str = ""
    model: str = ""
    pool: str = ""
    label: str = ""
    state: str = ""

    @property
    def label_pair(self) -> tuple[str, str | None] | None:
        if not self.label:
            return None
        key, sep, value = self.label.partition("=")
        return key, (value if sep else None)

    def matches_labels(self, labels: Mapping[str, str]) -> bool:
        pair = self.label_pair
        if pair is None:
            return True
        key, value = pair
        return key in labels if value is None else labels.get(key) == value

    def query(self, **override: str) -> str:
        """The permalink query string (without "?"), with some parameters replaced."""
        values = {p: getattr(self, p) for p in PARAMETERS} | override
        return urlencode([(k, v) for k, v in values.items() if v])

    def as_dict(self) -> dict[str, str]:
        return {p: getattr(self, p) for p in PARAMETERS}


def parse_filters(params: Mapping[str, str]) -> FleetFilter:
    """Read the filters from query parameters; unknown parameters are ignored, bad values raise."""
    values = {p: (params.get(p) or "").strip() for p in PARAMETERS}
    for name in ("cluster", "model", "pool"):
        if values[name] and not _TOKEN.match(values[name]):
            raise FilterError(name, f"{values[name][:80]!r} is not a valid name")
    if values["state"] and values["state"] not in STATES:
        raise FilterError("state", f"{values['state'][:80]!r} is not one of {', '.join(STATES)}")
    if values["label"]:
        key, sep, value = values["label"].partition("=")
        if not _LABEL_KEY.match(key) or (sep and not _LABEL_VALUE.match(value)):
            raise FilterError("label", f"{values['label'][:80]!r} is not a node label key or key=value")
    return FleetFilter(**values)
