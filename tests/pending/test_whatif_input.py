""" "Will it fit?" with a claim that parses but has the wrong shape: the pending page's form and
``POST /api/v1/whatif`` answer 400 naming the field, never 500 (real PostgreSQL, a small fleet)."""

from __future__ import annotations

import json
from html import unescape
from itertools import count
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings

from fleet import ingest
from fleet.normalize import normalize
from simulator import nvidia
from tests.unit.test_whatif_shapes import CLAIM, TEMPLATE, mutated_claims

URL = "/claims/pending/"
API = "/api/v1/whatif?cluster=sim"


@pytest.fixture
def small_fleet() -> str:
    """Cluster "sim": one H100 node with two GPUs, one A100 node in MIG mode, the driver's classes."""
    cluster = ingest.get_or_create_cluster("sim")
    versions = count(10)
    objs = [("Node", nvidia.node_object("n1", "H100")), ("Node", nvidia.node_object("n2", "A100"))]
    objs += [("ResourceSlice", s) for s in nvidia.node_slices("n1", "H100", gpus=2)]
    objs += [("ResourceSlice", s) for s in nvidia.node_slices("n2", "A100", mode="static-mig", gpus=1)]
    objs += [("DeviceClass", dc) for dc in nvidia.device_classes()]
    for kind, obj in objs:
        obj["metadata"]["resourceVersion"] = str(next(versions))
        ingest.apply_batch(cluster, kind, [ingest.Change("upsert", normalize(kind, obj))])
    return "sim"


def form_error(html: str) -> str:
    start = html.index('id="whatif-error">') + len('id="whatif-error">')
    return unescape(html[start : html.index("</p>", start)])


# The shapes that made both paths answer 500 (lint.py and diagnosis.py read them as well-formed).
BAD = [
    ('kind: ResourceClaim\nspec: {devices: "x"}\n', "spec.devices", "expected an object"),
    ("kind: ResourceClaim\nspec: {devices: {requests: [1, 2]}}\n", "spec.devices.requests[0]", "object"),
    (
        'kind: ResourceClaim\nspec: {devices: {requests: [{name: a, exactly: {deviceClassName: g}}, "x"]}}\n',
        "spec.devices.requests[1]",
        "expected an object",
    ),
    (
        'kind: ResourceClaim\nspec: {devices: {requests: [{name: a, exactly: "x"}]}}\n',
        "spec.devices.requests[0].exactly",
        "expected an object",
    ),
    (
        'kind: ResourceClaim\nspec: {devices: {requests: [{name: a, exactly: {count: "x"}}]}}\n',
        "spec.devices.requests[0].count",
        "expected an integer",
    ),
    (
        'kind: ResourceClaim\nspec: {devices: {requests: [{name: a, exactly: {selectors: ["x"]}}]}}\n',
        "spec.devices.requests[0].selectors[0]",
        "expected an object",
    ),
    (
        "kind: ResourceClaim\nspec: {devices: {constraints: [{matchAttribute: 5}]}}\n",
        "spec.devices.constraints[0].matchAttribute",
        "expected a string",
    ),
    ('kind: ResourceClaim\nmetadata: "x"\nspec: {devices: {}}\n', "metadata", "expected an object"),
    (
        "kind: ResourceClaim\nspec: {devices: {requests: [{name: a, exactly: {deviceClassName: g}}],\n"
        "  config: [5]}}\n",
        "spec.devices.config[0]",
        "expected an object",
    ),
    (
        'kind: ResourceClaimTemplate\nspec: {spec: {devices: {requests: [{name: a, firstAvailable: "x"}]}}}',
        "spec.spec.devices.requests[0].firstAvailable",
        "expected a list",
    ),
    ('kind: ResourceClaimTemplate\nspec: {spec: "x"}\n', "spec.spec", "expected an object"),
]


@pytest.mark.parametrize(("text", "field", "problem"), BAD)
def test_a_claim_of_the_wrong_shape_is_a_form_error_naming_the_field(
    signed_in, small_fleet, text, field, problem
):
    response = signed_in.post(URL, {"cluster": small_fleet, "spec": text})
    assert response.status_code == 400
    html = response.content.decode()
    error = form_error(html)
    assert error.startswith(f"{field}: ") and problem in error
    assert 'id="whatif-result"' not in html


@pytest.mark.parametrize(("text", "field", "problem"), BAD)
def test_a_claim_of_the_wrong_shape_is_an_api_400_naming_the_field(
    signed_in, small_fleet, text, field, problem
):
    response = signed_in.post(API, text, content_type="application/yaml")
    assert response.status_code == 400
    body = response.json()
    assert list(body) == [field] and problem in body[field][0]


def test_the_valid_samples_are_diagnosed_by_both(signed_in, small_fleet):
    for obj in (CLAIM, TEMPLATE):
        response = signed_in.post(URL, {"cluster": small_fleet, "spec": json.dumps(obj)})
        assert response.status_code == 200 and 'id="whatif-result"' in response.content.decode()
        answer = signed_in.post(API, json.dumps(obj), content_type="application/json")
        assert answer.status_code == 200 and answer.json()["category"]


def _post_both(client: Client, obj: Any) -> tuple[int, int]:
    text = json.dumps(obj)
    form = client.post(URL, {"cluster": "sim", "spec": text}).status_code
    api = client.post(API, text, content_type="application/json").status_code
    return form, api


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(obj=mutated_claims())
def test_a_mutated_claim_never_makes_the_form_or_the_api_fail(signed_in, small_fleet, obj):
    # The requests only read: the fleet loaded once serves every example.
    form, api = _post_both(signed_in, obj)
    assert form in (200, 400), form
    assert api in (200, 400), api
    assert (form == 200) == (api == 200)  # both paths check the same way
