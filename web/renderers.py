"""Fast renderers for the REST API: JSON through orjson, and CSV for every list endpoint (``?format=csv``).

List endpoints hand these renderers plain dicts built from ``QuerySet.values()``, so rendering is the
only per-row cost left. CSV flattens nested objects into dotted columns and writes lists as JSON text.

Every CSV export (API lists, the triage report, ``manage.py triage``) goes through :class:`CSVRenderer`, which
makes formula-looking text inert (OWASP "CSV injection"): cluster data such as Event messages, node labels or
product names is written by whoever can create objects in a cluster, and a spreadsheet would run it.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z


def _default(value: Any) -> Any:
    """Types orjson does not know: Decimals (resourceVersions up to 128 bits) become strings."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, ReturnDict | ReturnList | Mapping):
        return dict(value) if isinstance(value, Mapping) else list(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def dumps(data: Any) -> bytes:
    return orjson.dumps(data, default=_default, option=_OPTIONS)


class ORJSONRenderer(JSONRenderer):
    """JSON through orjson (several times faster than the standard library on large lists)."""

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        return dumps(data)


# OWASP's list: a cell starting with one of these is a formula (or becomes one once a spreadsheet trims
# it); full-width forms are included because some spreadsheets fold them to ASCII.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def neutralise(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: formula-looking strings get a leading ``'`` (OWASP's advice).

    Numbers stay numbers (``-3`` is a value, not a formula); only text can carry a formula. Leading spaces
    and newlines are looked through because spreadsheets trim them before parsing.
    """
    if isinstance(value, str) and value.lstrip(" \n").startswith(_FORMULA_START):
        return "'" + value
    return value


def _flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            out[name] = dumps(list(value)).decode()
        elif value is None:
            out[name] = ""
        elif isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, dt.datetime):
            out[name] = value.isoformat().replace("+00:00", "Z")
        else:
            out[name] = value
    return out


def csv_rows(data: Any) -> list[dict[str, Any]]:
    """The rows a response body holds: a page's ``results``, a list, or one object."""
    if isinstance(data, Mapping) and isinstance(data.get("results"), list):
        data = data["results"]
    if isinstance(data, Mapping):
        data = [data]
    return [_flatten(row) if isinstance(row, Mapping) else {"value": row} for row in data or []]


class CSVRenderer(BaseRenderer):
    """CSV of a list page (the same rows as its JSON); the next page's cursor is in the Link header."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        rows = [{neutralise(key): neutralise(value) for key, value in row.items()} for row in csv_rows(data)]
        columns: dict[str, None] = {}
        for row in rows:
            columns.update(dict.fromkeys(row))
        buffer = io.StringIO()
        # RFC 4180's CRLF: the writer then quotes every cell holding a CR or LF, so a message with a bare CR
        # cannot start a new row in a spreadsheet.
        writer = csv.DictWriter(buffer, fieldnames=list(columns), restval="", lineterminator="\r\n")
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue().encode()
