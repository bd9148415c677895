"""``GET /api/v1/idle/``: claims that held GPUs idle, and the idle GPU-hours per namespace and model.

The serializers only describe the report for the OpenAPI schema; the data comes from ``usage.report``, so
the API, the page and ``manage.py idle`` agree.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework import serializers as s
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.access.visibility import visibility_for
from fleet.api.base import StrictContentNegotiation, reject_empty
from usage.report import SECTIONS, WindowError, idle_report, section_rows
from usage.trends import GROUPS, trend_rows
from web.renderers import CSVRenderer, ORJSONRenderer

PARAMETERS = ("since", "until", "below", "cluster", "section", "format")
_WHEN = "ISO 8601 (no offset: UTC), a duration before now (24h, 7d; for since: before until) or 'now'"


class IdleWindow(s.Serializer):
    since = s.DateTimeField()
    until = s.DateTimeField()
    cluster = s.CharField(allow_null=True)
    below_percent = s.FloatField(help_text="Claims whose mean activity is below this are listed")
    idle_window_minutes = s.IntegerField(help_text="Below the threshold this long makes a device idle now")


class IdleClaimRow(s.Serializer):
    cluster = s.CharField()
    namespace = s.CharField()
    claim = s.CharField()
    model = s.CharField()
    profile = s.CharField(allow_blank=True)
    nodes = s.ListField(child=s.CharField())
    devices = s.IntegerField()
    gpus = s.FloatField(help_text="Held GPUs; a MIG device counts its compute slices / 7")
    idle_since = s.DateTimeField(allow_null=True, help_text="Null: not idle at its last sample")
    idle_gpu_hours = s.FloatField()
    observed_hours = s.FloatField()
    mean_active_percent = s.FloatField(allow_null=True, help_text="Null: only gaps were sampled")
    gap_samples = s.IntegerField(help_text="Rounds without a value (shown as gaps, never as 0 %)")
    first_seen = s.DateTimeField()
    last_seen = s.DateTimeField()
    device_names = s.ListField(child=s.CharField())
    blocked = s.IntegerField(help_text="Claims pending for lack of this model's capacity while it idled")
    blocked_examples = s.ListField(child=s.CharField(), help_text="Some of them (visible namespaces only)")


class WasteRow(s.Serializer):
    namespace = s.CharField()
    model = s.CharField()
    claims = s.IntegerField()
    idle_gpu_hours = s.FloatField()


class IdleReport(s.Serializer):
    window = IdleWindow()
    unavailable_since = s.DateTimeField(allow_null=True, help_text="Set while Prometheus does not answer")
    claims = IdleClaimRow(many=True)
    waste = WasteRow(many=True)


class IdleView(APIView):
    """Claims that held GPUs idle in a window (default the last 24 hours): idle now for at least the idle
    window, or with a mean activity below ``below`` percent; largest waste first; and the idle GPU-hours per
    namespace and model. Only namespaces you may see are listed. ``?format=csv`` renders one ``section``
    (default ``claims``)."""

    renderer_classes = [ORJSONRenderer, CSVRenderer]
    content_negotiation_class = StrictContentNegotiation

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since", OpenApiTypes.DATETIME, description=f"Start (default 24h before until): {_WHEN}"
            ),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description=f"End (default now): {_WHEN}"),
            OpenApiParameter(
                "below",
                {"type": "number", "minimum": 0, "maximum": 100},
                description="Mean activity threshold, percent (default CLAIMSCOPE_IDLE_BELOW_PERCENT)",
            ),
            OpenApiParameter("cluster", OpenApiTypes.STR, description="Only this cluster"),
            OpenApiParameter("section", OpenApiTypes.STR, enum=SECTIONS, description="CSV: which list"),
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
        ],
        responses={200: IdleReport},
    )
    def get(self, request: Request) -> Response:
        reject_empty(request, PARAMETERS)
        params = request.query_params
        section = params.get("section", "claims")
        if section not in SECTIONS:
            raise exceptions.ValidationError({"section": [f"one of {', '.join(SECTIONS)}"]})
        for name in PARAMETERS:
            if "\x00" in params.get(name, ""):
                raise exceptions.ValidationError({name: ["must not contain NUL"]})
        vis = visibility_for(request.user)
        try:
            data: Any = idle_report(
                params.get("since"),
                params.get("until"),
                params.get("below"),
                params.get("cluster"),
                vis.q(),
                allows=vis.allows,
            )
        except WindowError as exc:
            raise exceptions.ValidationError({exc.parameter: [exc.message]}) from None
        if request.accepted_renderer.format == "csv":
            data = section_rows(data, section)
        return Response(data)


class TrendPoint(s.Serializer):
    time = s.DateTimeField()
    cluster = s.CharField()
    model = s.CharField(required=False, help_text="With group model or model,namespace")
    namespace = s.CharField(required=False, allow_blank=True, help_text="Empty: devices nobody holds")
    allocated = s.FloatField(help_text="Held GPUs (MIG devices as compute slices / 7)")
    measured = s.FloatField(help_text="Held GPUs with a sample (the rest were gaps)")
    active = s.FloatField(help_text="Held GPUs weighted by measured activity")
    idle = s.FloatField(help_text="Held GPUs idle for the idle window")
    utilization_percent = s.FloatField(allow_null=True)


class TrendWindow(s.Serializer):
    since = s.DateTimeField()
    until = s.DateTimeField()
    cluster = s.CharField(allow_null=True)
    group = s.ChoiceField(choices=list(GROUPS))
    resolution = s.ChoiceField(choices=["minute", "hour"])
    gap_seconds = s.IntegerField(
        help_text="Two points of a group further apart than this have a gap between them (missed rounds)"
    )


class TrendReport(s.Serializer):
    window = TrendWindow()
    unavailable_since = s.DateTimeField(allow_null=True, help_text="Set while Prometheus does not answer")
    truncated = s.BooleanField(help_text="More than 50,000 points: narrow the window")
    points = TrendPoint(many=True)


TREND_PARAMETERS = ("since", "until", "cluster", "group", "format")


class UsageTrendsView(APIView):
    """Allocation against measured utilization over time, summed per model, namespace or both (default
    model): per minute up to 7 days back, hourly beyond (kept a year). ``?format=csv`` gives the points."""

    renderer_classes = [ORJSONRenderer, CSVRenderer]
    content_negotiation_class = StrictContentNegotiation

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since", OpenApiTypes.DATETIME, description=f"Start (default 24h before until): {_WHEN}"
            ),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description=f"End (default now): {_WHEN}"),
            OpenApiParameter("cluster", OpenApiTypes.STR, description="Only this cluster"),
            OpenApiParameter(
                "group", OpenApiTypes.STR, enum=list(GROUPS), description="Sum per (default model)"
            ),
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
        ],
        responses={200: TrendReport},
    )
    def get(self, request: Request) -> Response:
        reject_empty(request, TREND_PARAMETERS)
        params = request.query_params
        for name in TREND_PARAMETERS:
            if "\x00" in params.get(name, ""):
                raise exceptions.ValidationError({name: ["must not contain NUL"]})
        try:
            data: Any = trend_rows(
                params.get("since"), params.get("until"), params.get("cluster"), params.get("group")
            )
        except WindowError as exc:
            raise exceptions.ValidationError({exc.parameter: [exc.message]}) from None
        if request.accepted_renderer.format == "csv":
            data = data["points"]
        return Response(data)
