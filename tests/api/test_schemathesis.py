"""Property-based tests of every operation against our own OpenAPI schema (schemathesis, bounded examples):
no 5xx, every response valid against the schema, auth enforced (the `ignored_auth` check)."""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, settings
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle
from schemathesis import checks

MAX_EXAMPLES = 25


def _openapi() -> dict:
    document = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(document, renderer_context={}))


schema = schemathesis.openapi.from_dict(_openapi())
# PostgreSQL text cannot hold NUL: such a parameter is a 400 (tested in test_endpoints), not a valid value.
schema.config.generation.update(allow_x00=False)


@pytest.fixture
def wsgi_app(monkeypatch):
    """The real Django WSGI stack, inside the test's transaction (as Django's test client does it)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    monkeypatch.setattr(UserRateThrottle, "THROTTLE_RATES", {"user": None, "anon": None})
    monkeypatch.setattr(AnonRateThrottle, "THROTTLE_RATES", {"user": None, "anon": None})
    yield WSGIHandler()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_data(fixture_fleet, sim_fleet, token):
    from claims.tasks import recompute_diagnoses
    from fleet.tasks.history import sample_allocation

    recompute_diagnoses("fixtures")
    sample_allocation()
    return {"Authorization": f"Token {token}"}


def test_every_operation_is_documented():
    paths = set(schema.raw_schema["paths"])
    for name in ("clusters", "streams", "nodes", "devices", "gpus", "slices", "device-classes", "claims"):
        assert f"/api/v1/{name}/" in paths
    for name in ("pods", "events", "pending", "heatmap", "summary", "history", "leaks"):
        assert f"/api/v1/{name}/" in paths


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(case, fuzz_data, wsgi_app):
    # A made-up cursor is well-formed for the schema (a string) but is not one we issued: 400 is right.
    made_up_cursor = bool((case.query or {}).get("cursor"))
    # A what-if body sent as YAML is text for the schema: any string is "valid", most are not claims.
    yaml_text = case.media_type == "application/yaml"
    # The triage window must have since < until (and since before now): a rule across parameters that
    # OpenAPI cannot state, so a schema-valid pair may rightly be a 400.
    windowed = ("/api/v1/triage/", "/api/v1/idle/", "/api/v1/usage-trends/")
    window = case.path in windowed and bool({"since", "until"} & set(case.query or {}))
    excluded = [checks.positive_data_acceptance] if made_up_cursor or yaml_text or window else []
    case.operation.schema.app = wsgi_app  # every request, the checks' own probes included, goes to the app
    try:
        case.call_and_validate(headers=fuzz_data, excluded_checks=excluded, app=wsgi_app)
    finally:
        case.operation.schema.app = None
