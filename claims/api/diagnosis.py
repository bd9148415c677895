"""REST endpoints of the diagnosis engine: ``POST /api/v1/whatif`` and ``GET /api/v1/claims/{id}/diagnosis``.

Routed by ``dashboard/api_urls.py`` through :data:`urlpatterns_v1`.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import path
from django.utils import timezone
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from claims.selectors import diagnose_now, stored_diagnosis
from fleet.access.visibility import redact_diagnosis, visibility_for
from fleet.models import ResourceClaim
from fleet.normalize import INT64_MAX, NormalizeError, clean_pasted_claim
from fleet.snapshot import SnapshotError, read_text

WHATIF_KINDS = ("ResourceClaim", "ResourceClaimTemplate")


class _RawParser(BaseParser):
    """Hands the body over as ``{"body": bytes}`` for any content type; YAML/JSON parsing is in the view."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> dict[str, Any]:
        return {"body": bytes(stream.read()) if stream is not None else b""}


def _error(message: str, code: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({"detail": message}, status=code)


# What the schema promises: the fields of a ResourceClaim or ResourceClaimTemplate (resource.k8s.io/v1)
# that lint and diagnosis read, with the types and limits ``fleet.normalize.check_claim_object`` enforces;
# other fields are accepted and ignored. A null field is read as absent, as the API server reads it. A body
# outside this is a 400 naming the field.


def _opt(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


def _list_of(items: dict[str, Any]) -> dict[str, Any]:
    return _opt({"type": "array", "items": items})


# fleet.quantity's grammar, with at most a two-digit exponent (it refuses |e| > 100).
_QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?$"
_DEVICE_FIELDS = {
    "deviceClassName": _opt({"type": "string", "maxLength": 253, "example": "gpu.nvidia.com"}),
    "selectors": _list_of(
        _opt(
            {
                "type": "object",
                "properties": {
                    "cel": _opt(
                        {
                            "type": "object",
                            "properties": {"expression": _opt({"type": "string", "maxLength": 10240})},
                        }
                    )
                },
            }
        )
    ),
    "allocationMode": _opt({"type": "string", "maxLength": 32, "example": "ExactCount"}),
    "count": _opt({"type": "integer", "minimum": 0, "maximum": INT64_MAX}),
    "adminAccess": _opt({"type": "boolean"}),
    "tolerations": _list_of({"type": "object"}),  # a null item is no toleration: refused
    "capacity": _opt(
        {
            "type": "object",
            "properties": {
                "requests": _opt(
                    {
                        "type": "object",
                        "additionalProperties": {
                            "oneOf": [
                                {"type": "string", "pattern": _QUANTITY_PATTERN},
                                {"type": "integer", "minimum": -INT64_MAX - 1, "maximum": INT64_MAX},
                            ]
                        },
                    }
                )
            },
        }
    ),
}
_NAME = {"type": "string", "minLength": 1, "maxLength": 63, "example": "gpu"}
_REQUEST = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _NAME,
        "exactly": _opt({"type": "object", "properties": _DEVICE_FIELDS}),
        "firstAvailable": _list_of(
            {"type": "object", "required": ["name"], "properties": {"name": _NAME, **_DEVICE_FIELDS}}
        ),
        **_DEVICE_FIELDS,  # v1beta1 put them on the request itself
    },
}
_CLAIM_SPEC = {
    "type": "object",
    "required": ["devices"],
    "properties": {
        "devices": {
            "type": "object",
            "required": ["requests"],
            "properties": {
                "requests": {"type": "array", "minItems": 1, "items": _REQUEST},
                "constraints": _list_of(
                    {  # a null item is no constraint: refused
                        "type": "object",
                        "properties": {
                            "requests": _list_of(_opt({"type": "string", "maxLength": 127})),
                            "matchAttribute": _opt({"type": "string", "maxLength": 253}),
                            "distinctAttribute": _opt({"type": "string", "maxLength": 253}),
                        },
                    }
                ),
            },
        }
    },
}
_METADATA = _opt(
    {
        "type": "object",
        "properties": {
            "name": _opt({"type": "string", "maxLength": 253}),
            "namespace": _opt(
                {"type": "string", "maxLength": 63, "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"}
            ),
            "uid": _opt({"type": "string", "maxLength": 128}),
        },
    }
)
_STATUS = _opt(
    {
        "type": "object",
        "properties": {
            "allocation": _opt(
                {
                    "type": "object",
                    "properties": {
                        "devices": _opt(
                            {
                                "type": "object",
                                "properties": {"results": _list_of(_opt({"type": "object"}))},
                            }
                        )
                    },
                }
            )
        },
    }
)
WHATIF_BODY = {
    "oneOf": [
        {
            "type": "object",
            "required": ["kind", "spec"],
            "properties": {
                "kind": {"type": "string", "enum": ["ResourceClaim"]},
                "metadata": _METADATA,
                "spec": _CLAIM_SPEC,
                "status": _STATUS,
            },
        },
        {
            "type": "object",
            "required": ["kind", "spec"],
            "properties": {
                "kind": {"type": "string", "enum": ["ResourceClaimTemplate"]},
                "metadata": _METADATA,
                "spec": {"type": "object", "required": ["spec"], "properties": {"spec": _CLAIM_SPEC}},
            },
        },
    ]
}


class _BodyRequired(AutoSchema):
    """drf-spectacular marks a request body given as a plain schema optional; the what-if body is not."""

    def _get_request_body(self, direction: str = "request") -> Any:
        body = super()._get_request_body(direction)
        if body:
            body["required"] = True
        return body


class WhatIfView(APIView):
    """Would this ResourceClaim or ResourceClaimTemplate (YAML or JSON body) fit the fleet right now?

    Query ``cluster`` picks the cluster when there are several. Returns the diagnosis object: ``category``,
    ``summary``, ``requests``, ``suggestions``, ``placement``, ``lint``. A body of the wrong shape is a 400
    naming the field: ``{"spec.devices.requests[1]": ["expected an object, got int"]}``."""

    parser_classes = [_RawParser]
    schema = _BodyRequired()

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
            claim = clean_pasted_claim(found[0])
        except NormalizeError as exc:
            # A 400 naming the field, as for query parameters: {"spec.devices.requests[1]": ["expected..."]}.
            return Response({exc.field or "body": [exc.problem]}, status=status.HTTP_400_BAD_REQUEST)
        try:
            # Lean: the claim is given here, the fleet is only read (a fifth of the memory).
            state = FleetState.from_db(request.query_params.get("cluster") or None, lean=True)
        except LookupError as exc:
            return _error(str(exc.args[0]), status.HTTP_404_NOT_FOUND)
        vis = visibility_for(request.user)
        cluster = state.cluster
        with state:  # released when done, not at the collector's next full run (FleetState.release)
            # Pods using a claim of a namespace the user may not see are not looked at (see claims.views).
            result = diagnose(state, claim, pods_in=lambda ns: vis.allows(cluster, ns)).as_dict()
        # The result names the claims holding matching devices: hide those of other namespaces.
        return Response(redact_diagnosis(result, vis, cluster))


class ClaimDiagnosisView(APIView):
    """The latest stored diagnosis of a claim (recomputed on fleet changes); computed now, and not stored,
    if none is stored yet."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: str | int) -> Response:
        # The id is matched as text so that a malformed one gets the API's JSON 404, not Django's page.
        text = str(pk)
        if not text.isdigit() or len(text) > 18:
            return _error(f"no claim with id {text[:40]!r}", status.HTTP_404_NOT_FOUND)
        # A claim in a namespace the user may not see is a 404 too: its existence is not confirmed.
        visible = ResourceClaim.objects.filter(visibility_for(request.user).q())
        claim = get_object_or_404(visible.select_related("cluster"), pk=int(text))
        stored = stored_diagnosis(claim)
        if stored is not None:
            result, computed_at = stored.result, stored.computed_at
        else:  # a GET never writes: the diagnosis task stores it on its next run
            result, computed_at = diagnose_now(claim), timezone.now()
        result = redact_diagnosis(result, visibility_for(request.user), claim.cluster.name)
        return Response({**result, "computed_at": computed_at, "claim_id": claim.pk})


urlpatterns_v1 = [
    path("whatif", WhatIfView.as_view(), name="whatif"),
    path("claims/<str:pk>/diagnosis", ClaimDiagnosisView.as_view(), name="claim-diagnosis"),
]
