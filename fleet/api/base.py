"""Building blocks of the REST API: strict pagination and ordering, duration filters, values()-based viewsets.

List endpoints read rows with ``QuerySet.values()`` and hand plain dicts to the orjson/CSV renderers: DRF
serializers only describe the rows for the OpenAPI schema. A bad query parameter is a 400 naming it, never
a silent fallback or a 500.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, QuerySet
from django.utils import timezone
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema_field
from rest_framework import exceptions, viewsets
from rest_framework.filters import OrderingFilter
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from web.renderers import CSVRenderer, ORJSONRenderer

MAX_PAGE_SIZE = 10_000
MAX_ID = 2**63 - 1
DURATION_PATTERN = r"^[0-9]{1,9}[smhdw]?$"
_DURATION = re.compile(r"^\s*(\d{1,9})\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Longer durations are cut to a century: nothing in a cluster is that old, and the cutoff stays a valid date.
MAX_DURATION = timedelta(days=36500)


def parse_duration(value: str) -> timedelta:
    """``"90"`` (seconds), ``"15m"``, ``"2h"``, ``"3d"``, ``"1w"`` as a timedelta (at most a century)."""
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a duration such as 90, 15m, 2h, 3d or 1w")
    # Cap the number before building the timedelta: a huge value would overflow it (OverflowError).
    seconds = min(int(match[1]) * _UNITS[match[2]], int(MAX_DURATION.total_seconds()))
    return timedelta(seconds=seconds)


class DurationField(forms.CharField):
    def to_python(self, value: Any) -> timedelta | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise DjangoValidationError(str(exc), code="invalid") from None


@extend_schema_field({"type": "string", "pattern": DURATION_PATTERN})
class DurationFilter(filters.Filter):
    """A duration parameter: 90 (seconds), 15m, 2h, 3d, 1w."""

    field_class = DurationField


@extend_schema_field({"type": "string", "pattern": DURATION_PATTERN})
class MinAgeFilter(filters.Filter):
    """Keep rows whose timestamp field is at least this old (``?age=2h``)."""

    field_class = DurationField

    def filter(self, qs: QuerySet[Any], value: timedelta | None) -> QuerySet[Any]:
        if value is None:
            return qs
        return qs.filter(**{f"{self.field_name}__lte": timezone.now() - value})


GENERIC_PARAMETERS = ("ordering", "cursor", "page_size", "format")


def reject_empty(request: Request, names: Iterable[str]) -> None:
    """A known parameter given with an empty value is a 400 naming it (it is never a valid value)."""
    empty = [n for n in names if request.query_params.get(n) == ""]
    if empty:
        raise exceptions.ValidationError({n: ["must not be empty"] for n in empty})


class UtcDateTimeFilter(filters.IsoDateTimeFilter):
    """An ISO 8601 date-time, compared in UTC: PostgreSQL refuses offsets over 15:59, Python allows 23:59."""

    def filter(self, qs: QuerySet[Any], value: datetime | None) -> QuerySet[Any]:
        if value is not None:
            try:
                value = value.astimezone(UTC)
            except OverflowError:  # within a day of year 1 or 9999: clamp to the representable range
                value = (
                    datetime.min.replace(tzinfo=UTC) if value.year < 2 else datetime.max.replace(tzinfo=UTC)
                )
        return super().filter(qs, value)


class StrictBooleanField(forms.Field):
    """true/false (or 1/0); anything else is invalid (django-filter would read it as "no filter")."""

    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        text = str(value).strip().lower()
        if text in ("true", "1"):
            return True
        if text in ("false", "0"):
            return False
        raise DjangoValidationError("must be true or false", code="invalid")


class BooleanFilter(filters.BooleanFilter):
    field_class = StrictBooleanField

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # A plain text widget: django-filter's BooleanWidget reads an unknown value as "no filter".
        kwargs.setdefault("widget", forms.TextInput)
        super().__init__(*args, **kwargs)


class StrictContentNegotiation(DefaultContentNegotiation):
    """An unknown or empty ``?format=`` is a 400 naming it (DRF's default answers 404, or ignores an empty
    one, so ``?format=`` would pass as JSON)."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> Any:
        renderers = list(renderers)
        wanted = format_suffix or request.query_params.get(self.settings.URL_FORMAT_OVERRIDE or "format")
        if wanted is not None and wanted not in {r.format for r in renderers}:
            known = ", ".join(r.format for r in renderers)
            raise exceptions.ValidationError({"format": [f"one of {known}"]})
        return super().select_renderer(request, renderers, format_suffix)


class StrictCursorPagination(CursorPagination):
    """Cursor pagination whose bad ``cursor`` or ``page_size`` is a 400 naming the parameter."""

    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    ordering = ("id",)

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise exceptions.ValidationError(
                {self.page_size_query_param: [f"must be an integer from 1 to {self.max_page_size}"]}
            )
        return int(raw)

    def get_paginated_response(self, data: Any) -> Response:
        """The page, with its neighbours also in a Link header (CSV has no room for them in the body)."""
        response = super().get_paginated_response(data)
        links = [(self.get_next_link(), "next"), (self.get_previous_link(), "prev")]
        header = ", ".join(f'<{url}>; rel="{rel}"' for url, rel in links if url)
        if header:
            response["Link"] = header
        return response

    def get_schema_operation_parameters(self, view: APIView) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for p in parameters:
            if p["name"] == self.page_size_query_param:
                p["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
            if p["name"] == self.cursor_query_param:
                p["description"] = "Opaque cursor from a previous page's next/previous link"
        return parameters

    def paginate_queryset(self, queryset: Any, request: Request, view: APIView | None = None) -> Any:
        try:
            return super().paginate_queryset(queryset, request, view)
        except (exceptions.NotFound, ValueError, TypeError, DjangoValidationError, OverflowError):
            raise exceptions.ValidationError({self.cursor_query_param: ["invalid cursor"]}) from None


class StrictOrderingFilter(OrderingFilter):
    """Ordering on the view's ``ordering_fields`` only (unknown fields are a 400), ``id`` as tie-breaker."""

    def get_ordering(self, request: Request, queryset: QuerySet[Any], view: APIView) -> Any:
        raw = request.query_params.get(self.ordering_param)
        if raw is None:
            return self.get_default_ordering(view)
        terms = [t.strip() for t in raw.split(",") if t.strip()]
        allowed = set(getattr(view, "ordering_fields", ()))
        bad = [t for t in terms if t.lstrip("-") not in allowed]
        if bad or not terms or len(terms) > 1:
            raise exceptions.ValidationError(
                {self.ordering_param: [f"one of {', '.join(sorted(allowed))}, optionally prefixed with '-'"]}
            )
        term = terms[0]
        tiebreak = getattr(view, "tiebreak", "id")
        if term.lstrip("-") == tiebreak:
            return (term,)
        return (term, f"-{tiebreak}" if term.startswith("-") else tiebreak)

    def get_schema_operation_parameters(self, view: APIView) -> list[dict[str, Any]]:
        fields = list(getattr(view, "ordering_fields", ()))
        return [
            {
                "name": self.ordering_param,
                "required": False,
                "in": "query",
                "description": "Sort by this field; '-' for descending",
                "schema": {"type": "string", "enum": [*fields, *(f"-{f}" for f in fields)]},
            }
        ]


class ValuesListViewSet(viewsets.GenericViewSet):
    """A read-only viewset that lists ``values()`` rows (see :class:`ValuesViewSet` to retrieve one).

    ``fields`` are the values() names, ``renames`` maps a values() name to its output key (e.g.
    ``cluster__name`` -> ``cluster``), and :meth:`decorate` may add fields to a page of rows with a constant
    number of queries.
    """

    fields: tuple[str, ...] = ()
    renames: dict[str, str] = {}
    ordering: tuple[str, ...] = ("id",)
    ordering_fields: tuple[str, ...] = ("id",)
    lookup_value_regex = "[^/]+"  # a non-numeric id is a JSON 404 from retrieve, not the HTML one
    renderer_classes = [ORJSONRenderer, CSVRenderer]
    content_negotiation_class = StrictContentNegotiation
    pagination_class = StrictCursorPagination
    filter_backends = [filters.DjangoFilterBackend, StrictOrderingFilter]

    def values(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.values(*self.fields)

    def decorate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return rows

    def finish(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = self.decorate(list(rows))
        if self.renames:
            renames = self.renames
            rows = [{renames.get(k, k): v for k, v in row.items()} for row in rows]
        return rows

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        filterset = getattr(self, "filterset_class", None)
        reject_empty(request, [*GENERIC_PARAMETERS, *(filterset.base_filters if filterset else ())])
        queryset = self.values(self.filter_queryset(self.get_queryset()))
        page = self.paginate_queryset(queryset)
        if page is None:
            return Response(self.finish(queryset))
        return self.get_paginated_response(self.finish(page))


class ValuesViewSet(ValuesListViewSet):
    """A :class:`ValuesListViewSet` that also retrieves one row by its integer id (404 when unknown)."""

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        raw = str(self.kwargs[self.lookup_url_kwarg or self.lookup_field])
        pk = int(raw) if raw.isascii() and raw.isdigit() else None
        row = (
            self.values(self.get_queryset().filter(pk=pk)).first()
            if pk is not None and pk <= MAX_ID
            else None
        )
        if row is None:
            raise exceptions.NotFound(f"no {self.object_name()} with id {raw[:40]}")
        return Response(self.finish([row])[0])

    def object_name(self) -> str:
        model: type[Model] = self.get_queryset().model
        return str(model._meta.verbose_name)
