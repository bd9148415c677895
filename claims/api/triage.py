"""``GET /api/v1/triage/``: the triage report (``claims.triage.report``) as JSON, or one section as CSV.

The serializers below only describe the report for the OpenAPI schema; the data comes from the pure
``claims.triage.report.build_report`` so the API, the page and the ``triage`` command agree.
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

from claims.triage.report import SECTIONS, section_rows
from claims.triage.selectors import report
from claims.triage.window import WindowError
from fleet.access.visibility import visibility_for
from fleet.api.base import StrictContentNegotiation, reject_empty
from web.renderers import CSVRenderer, ORJSONRenderer

PARAMETERS = ("since", "until", "cluster", "section", "format")


class WindowRow(s.Serializer):
    since = s.DateTimeField()
    until = s.DateTimeField()
    cluster = s.CharField(allow_null=True)
    default = s.BooleanField(help_text="True when neither since nor until was given")
    min_pending_seconds = s.IntegerField()
    leak_after_seconds = s.IntegerField()


class TotalsRow(s.Serializer):
    pended = s.IntegerField(help_text="Claims that pended in the window (visible or not)")
    still_pending = s.IntegerField()
    allocated_after_wait = s.IntegerField()
    allocated_promptly = s.IntegerField(help_text="Pended for less than min_pending_seconds")
    hidden = s.IntegerField(help_text="Pended claims in namespaces you cannot see (not listed)")
    freed = s.IntegerField()
    leaks = s.IntegerField()


class PendedRow(s.Serializer):
    cluster = s.CharField()
    namespace = s.CharField()
    name = s.CharField()
    pending_since = s.DateTimeField()
    pending_until = s.DateTimeField(allow_null=True, help_text="Null: still pending at the window's end")
    seconds = s.IntegerField()
    outcome = s.ChoiceField(choices=["pending", "allocated", "deleted"])
    node = s.CharField(allow_blank=True)
    category = s.CharField()
    cause = s.CharField(allow_blank=True, help_text="Summary line of its cause group")
    cause_key = s.CharField(allow_blank=True)
    categories = s.ListField(child=s.CharField(), help_text="Every category diagnosed while it pended")


class CauseRow(s.Serializer):
    key = s.CharField(allow_blank=True, help_text="Empty for the anonymous group of other namespaces")
    cluster = s.CharField()
    category = s.CharField()
    summary = s.CharField()
    count = s.IntegerField()
    hidden = s.IntegerField()
    examples = s.ListField(child=s.CharField())
    suggestion = s.CharField(allow_blank=True)


class FreedRow(s.Serializer):
    at = s.DateTimeField()
    cluster = s.CharField()
    namespace = s.CharField()
    name = s.CharField()
    node = s.CharField(allow_blank=True)
    devices = s.IntegerField()
    models = s.ListField(child=s.CharField())
    waiting = s.IntegerField(help_text="Claims then waiting for devices of these models/profiles")
    waiting_examples = s.ListField(child=s.CharField())


class MigExhaustionRow(s.Serializer):
    cluster = s.CharField()
    model = s.CharField()
    profile = s.CharField()
    start = s.DateTimeField()
    end = s.DateTimeField()
    seconds = s.IntegerField()
    waiting = s.IntegerField()
    idle_bigger = s.DictField(child=s.IntegerField(), help_text="Idle bigger MIG slices per profile")


class LeakRow(s.Serializer):
    cluster = s.CharField()
    namespace = s.CharField()
    name = s.CharField()
    node = s.CharField(allow_blank=True)
    devices = s.ListField(child=s.CharField())
    allocated_at = s.DateTimeField(allow_null=True)
    unreserved_since = s.DateTimeField()
    seconds = s.IntegerField()


class AllocationSeries(s.Serializer):
    cluster = s.CharField()
    model = s.CharField()
    time = s.ListField(child=s.DateTimeField())
    allocated = s.ListField(child=s.FloatField(), help_text="Allocated compute slices (7 per GPU)")
    total = s.ListField(child=s.FloatField())


class TriageReport(s.Serializer):
    window = WindowRow()
    totals = TotalsRow()
    pended = PendedRow(many=True)
    causes = CauseRow(many=True)
    freed = FreedRow(many=True)
    mig_exhaustion = MigExhaustionRow(many=True)
    leaks = LeakRow(many=True)
    allocation = AllocationSeries(many=True)


_WHEN = (
    "ISO 8601 (2026-03-06T18:00:00Z; no offset: the server's TIME_ZONE), a weekday and time "
    "('friday 18:00': the last one before `until`), a duration ago (24h, 3d) or 'now'"
)


class TriageView(APIView):
    """The triage report for a window: claims that pended and for how long (longest first), causes grouped
    with counts and examples, what freed capacity, MIG-profile exhaustion, suspected leaks and allocation per
    model over the window. Default window: since the last Friday 18:00 on Saturday to Monday, else the last
    24 hours. Claims in namespaces you cannot see are counted, not named. ``?format=csv`` renders one
    ``section`` (default ``pended``)."""

    renderer_classes = [ORJSONRenderer, CSVRenderer]
    content_negotiation_class = StrictContentNegotiation

    @extend_schema(
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME, description=f"Start: {_WHEN}"),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description=f"End (default now): {_WHEN}"),
            OpenApiParameter("cluster", OpenApiTypes.STR, description="Only this cluster"),
            OpenApiParameter("section", OpenApiTypes.STR, enum=SECTIONS, description="CSV: which list"),
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
        ],
        responses={200: TriageReport},
    )
    def get(self, request: Request) -> Response:
        reject_empty(request, PARAMETERS)
        params = request.query_params
        section = params.get("section", "pended")
        if section not in SECTIONS:
            raise exceptions.ValidationError({"section": [f"one of {', '.join(SECTIONS)}"]})
        for name in ("since", "until", "cluster"):
            if "\x00" in params.get(name, ""):
                raise exceptions.ValidationError({name: ["must not contain NUL"]})
        vis = visibility_for(request.user)
        try:
            # Like the list filters: an unknown cluster has nothing in it, it is not an error.
            since, until, cluster = params.get("since"), params.get("until"), params.get("cluster")
            data: Any = report(since, until, cluster, vis.allows, strict=False)
        except WindowError as exc:
            raise exceptions.ValidationError({exc.parameter: [exc.message]}) from None
        if request.accepted_renderer.format == "csv":
            data = section_rows(data, section)
        return Response(data)
