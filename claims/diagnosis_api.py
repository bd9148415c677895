"""REST endpoints of the diagnosis engine: ``POST /api/v1/whatif`` and ``GET /api/v1/claims/{id}/diagnosis``.

Wired by the lead into ``dashboard/api_urls.py`` through :data:`urlpatterns_v1`.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from claims.models import ClaimDiagnosis, ResourceClaim
from fleet.snapshot import SnapshotError, read_text

WHATIF_KINDS = ("ResourceClaim", "ResourceClaimTemplate")


class _RawParser(BaseParser):
    """Hands the body over as ``{"body": bytes}`` for any content type; YAML/JSON parsing is in the view."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> dict[str, Any]:
        return {"body": bytes(stream.read()) if stream is not None else b""}


def _error(message: str, code: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({"detail": message}, status=code)


# What the schema promises: a Kubernetes object of one of the two kinds, with a spec.
WHATIF_BODY = {
    "type": "object",
    "required": ["kind", "spec"],
    "properties": {
        "apiVersion": {"type": "string", "example": "resource.k8s.io/v1"},
        "kind": {"type": "string", "enum": list(WHATIF_KINDS)},
        "metadata": {"type": "object"},
        "spec": {"type": "object"},
    },
}


class WhatIfView(APIView):
    """Would this ResourceClaim or ResourceClaimTemplate (YAML or JSON body) fit the fleet right now?

    Query ``cluster`` picks the cluster when there are several. Returns the diagnosis object: ``category``,
    ``summary``, ``requests``, ``suggestions``, ``placement``, ``lint``."""

    parser_classes = [_RawParser]

    @extend_schema(
        request={"application/json": WHATIF_BODY, "application/yaml": OpenApiTypes.STR},
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT, 404: OpenApiTypes.OBJECT},
        parameters=[OpenApiParameter("cluster", str, description="cluster name (when there are several)")],
    )
    def post(self, request: Request) -> Response:
        data = request.data
        body = data.get("body", b"") if isinstance(data, dict) else b""
        if not isinstance(body, bytes) or not body:
            return _error("empty body: send a ResourceClaim or ResourceClaimTemplate as YAML or JSON")
        try:
            objs = read_text(body, "body")
        except SnapshotError as exc:
            return _error(str(exc))
        found = [o for o in objs if o.get("kind") in WHATIF_KINDS]
        if not found:
            return _error(f"the body holds no {' or '.join(WHATIF_KINDS)}")
        try:
            state = FleetState.from_db(request.query_params.get("cluster") or None)
        except LookupError as exc:
            return _error(str(exc.args[0]), status.HTTP_404_NOT_FOUND)
        return Response(diagnose(state, found[0]).as_dict())


class ClaimDiagnosisView(APIView):
    """The latest stored diagnosis of a claim (recomputed on fleet changes); computed now if none is
    stored yet."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: str | int) -> Response:
        # The id is matched as text so that a malformed one gets the API's JSON 404, not Django's page.
        text = str(pk)
        if not text.isdigit() or len(text) > 18:
            return _error(f"no claim with id {text[:40]!r}", status.HTTP_404_NOT_FOUND)
        claim = get_object_or_404(ResourceClaim.objects.select_related("cluster"), pk=int(text))
        stored = ClaimDiagnosis.objects.filter(claim=claim).first()
        if stored is None:
            from claims.tasks import store_diagnosis

            stored = store_diagnosis(FleetState.from_db(claim.cluster.name), claim)
        return Response({**stored.result, "computed_at": stored.computed_at, "claim_id": claim.pk})


urlpatterns_v1 = [
    path("whatif", WhatIfView.as_view(), name="whatif"),
    path("claims/<str:pk>/diagnosis", ClaimDiagnosisView.as_view(), name="claim-diagnosis"),
]
