"""A pasted ResourceClaim(Template) is checked for shape before lint and diagnosis read it: a bad shape is a
NormalizeError naming the field, and whatever passes the check can be linted and diagnosed without an
exception (the "Will it fit?" form and ``POST /api/v1/whatif`` rely on both)."""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from claims.lint import lint_object
from fleet.normalize import NormalizeError, check_claim_object, clean_pasted_claim
from simulator import nvidia

MEMORY = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"

CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "job", "namespace": "research"},
    "spec": {
        "devices": {
            "requests": [
                nvidia.exactly_request("gpu", "gpu.nvidia.com", 2, [MEMORY]),
                nvidia.first_available_request(
                    "pref",
                    [
                        nvidia.subrequest("big", "gpu.nvidia.com", 1, [MEMORY]),
                        nvidia.subrequest("mig", "mig.nvidia.com", 1),
                    ],
                ),
                nvidia.exactly_request(
                    "tol",
                    "gpu.nvidia.com",
                    tolerations=[{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}],
                    capacity={"memory": "10Gi"},
                ),
            ],
            "constraints": [
                {"requests": ["gpu", "tol"], "matchAttribute": "gpu.nvidia.com/productName"},
                {"distinctAttribute": "gpu.nvidia.com/uuid"},
            ],
            "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"a": 1}}}],
        }
    },
}
TEMPLATE: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "t", "namespace": "research"},
    "spec": {"metadata": {"labels": {"a": "b"}}, "spec": copy.deepcopy(CLAIM["spec"])},
}


ALLOCATED = copy.deepcopy(CLAIM)
ALLOCATED["status"] = {
    "allocation": {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]
        }
    },
    "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
}


@functools.cache
def fleet() -> FleetState:
    """One H100 node with full GPUs, one A100 node in MIG mode, the driver's device classes."""
    objs = [nvidia.node_object("n1", "H100"), nvidia.node_object("n2", "A100")]
    objs += nvidia.node_slices("n1", "H100", gpus=2)
    objs += nvidia.node_slices("n2", "A100", mode="static-mig", gpus=1)
    objs += nvidia.device_classes()
    return FleetState.from_objects(objs, cluster="unit")


@functools.cache
def empty_fleet() -> FleetState:
    """A cluster just added: no node, no slice, no class."""
    return FleetState.from_objects([], cluster="empty")


RC = "kind: ResourceClaim\n"
T = "kind: ResourceClaimTemplate\n"


def problem(text: str) -> tuple[str, str]:
    with pytest.raises(NormalizeError) as err:
        check_claim_object(yaml.safe_load(text))
    return err.value.field, err.value.problem


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ('kind: ResourceClaim\nspec: {devices: "x"}', "spec.devices", "expected an object"),
        ("kind: ResourceClaim\nspec: {devices: {requests: [1, 2]}}", "spec.devices.requests[0]", "object"),
        (
            RC + 'spec: {devices: {requests: [{name: a, exactly: {deviceClassName: g}}, "x"]}}',
            "spec.devices.requests[1]",
            "expected an object",
        ),
        (
            'kind: ResourceClaim\nspec: {devices: {requests: [{name: a, exactly: "x"}]}}',
            "spec.devices.requests[0].exactly",
            "expected an object",
        ),
        (
            'kind: ResourceClaim\nspec: {devices: {requests: [{name: a, exactly: {count: "x"}}]}}',
            "spec.devices.requests[0].count",
            "expected an integer",
        ),
        (
            'kind: ResourceClaim\nspec: {devices: {requests: [{name: a, exactly: {selectors: ["x"]}}]}}',
            "spec.devices.requests[0].selectors[0]",
            "expected an object",
        ),
        (
            "kind: ResourceClaim\nspec: {devices: {constraints: [{matchAttribute: 5}]}}",
            "spec.devices.constraints[0].matchAttribute",
            "expected a string",
        ),
        (
            "kind: ResourceClaim\nspec: {devices: {constraints: [{requests: [a, 1]}]}}",
            "spec.devices.constraints[0].requests[1]",
            "expected a string",
        ),
        (
            "kind: ResourceClaim\nspec: {devices: {config: [{opaque: {}}, null]}}",
            "spec.devices.config[1]",
            "missing",
        ),
        (
            'kind: ResourceClaim\nspec: {devices: {config: ["x"]}}',
            "spec.devices.config[0]",
            "expected an object",
        ),
        (
            "kind: ResourceClaim\nspec: {devices: {config: [{requests: [a, 1]}]}}",
            "spec.devices.config[0].requests[1]",
            "expected a string",
        ),
        (
            "kind: ResourceClaim\nspec: {devices: {config: [{opaque: 5}]}}",
            "spec.devices.config[0].opaque",
            "an object",
        ),
        ('kind: ResourceClaim\nmetadata: "x"\nspec: {}', "metadata", "expected an object"),
        ("kind: ResourceClaim\nmetadata: {name: 5}\nspec: {}", "metadata.name", "expected a string"),
        ("kind: ResourceClaim\nmetadata: {namespace: [1]}\nspec: {}", "metadata.namespace", "a string"),
        ("kind: ResourceClaim\nmetadata: {namespace: a/b}\nspec: {}", "metadata.namespace", "DNS label"),
        ('kind: ResourceClaim\nstatus: {allocation: "x"}\nspec: {}', "status.allocation", "an object"),
        ('kind: ResourceClaimTemplate\nspec: {spec: "x"}', "spec.spec", "expected an object"),
        ("kind: ResourceClaimTemplate\nspec: {}", "spec.spec", "missing"),
        (
            T + 'spec: {spec: {devices: {requests: [{name: a, firstAvailable: "x"}]}}}',
            "spec.spec.devices.requests[0].firstAvailable",
            "expected a list",
        ),
        (
            T + "spec: {spec: {devices: {requests: [{name: a, firstAvailable: [1]}]}}}",
            "spec.spec.devices.requests[0].firstAvailable[0]",
            "expected an object",
        ),
        (
            RC + "spec: {devices: {requests: [{name: a, exactly: {capacity: {requests: {memory: zz}}}}]}}",
            "spec.devices.requests[0].capacity.requests.memory",
            "not a quantity",
        ),
    ],
)
def test_a_bad_shape_names_the_field(text, field, words):
    got_field, got_problem = problem(text)
    assert got_field == field
    assert words in got_problem


def test_a_claim_asking_for_no_device_and_a_too_deep_one_are_refused():
    assert problem(RC + "spec: {devices: {}}") == (
        "spec.devices.requests",
        "no request: the claim asks for no device",
    )
    assert problem(T + "spec: {spec: {devices: {requests: []}}}")[0] == "spec.spec.devices.requests"
    # Deeper than diagnosis can copy, yet within what the YAML and JSON parsers accept.
    nested: list[Any] = []
    for _ in range(900):
        nested = [nested]
    deep = copy.deepcopy(CLAIM)
    deep["spec"]["devices"]["config"] = [{"opaque": {"parameters": nested}}]
    with pytest.raises(NormalizeError, match="nested deeper than 64 levels") as err:
        clean_pasted_claim(deep)
    assert err.value.field.startswith("spec.devices.config[0].opaque.parameters[0][0]")


def test_null_fields_are_unset_as_the_api_server_reads_them():
    obj = copy.deepcopy(CLAIM)
    obj["spec"]["devices"]["requests"][0]["exactly"]["count"] = None
    obj["metadata"]["uid"] = None
    cleaned = clean_pasted_claim(obj)
    assert "count" not in cleaned["spec"]["devices"]["requests"][0]["exactly"]
    assert "uid" not in cleaned["metadata"]
    assert obj["metadata"]["uid"] is None  # the input is not modified


def test_a_claim_being_written_needs_no_uid_nor_resource_version():
    spec = check_claim_object(CLAIM)
    assert [r.name for r in spec.requests] == ["gpu", "pref", "tol"]
    assert check_claim_object({"kind": "ResourceClaim", "spec": CLAIM["spec"]}).requests
    assert [r.name for r in check_claim_object(TEMPLATE).requests] == ["gpu", "pref", "tol"]
    # Hand-written YAML may give a quantity as a plain number, as the API server accepts.
    assert check_claim_object(yaml.safe_load(yaml.safe_dump(CLAIM).replace("10Gi", "40")))


@pytest.mark.parametrize("obj", [CLAIM, TEMPLATE, ALLOCATED])
@pytest.mark.parametrize("state", [fleet, empty_fleet])
def test_the_valid_samples_are_diagnosed(obj, state):
    result = diagnose(state(), clean_pasted_claim(obj)).as_dict()
    assert result["category"]


# ------------------------------------------------------------------------------------------ fuzzing

_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.sampled_from(["", "x", "All", "ExactCount", "gpu.nvidia.com", "mig.nvidia.com", "40Gi", "Exists"]),
    st.text(max_size=5),
    st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.just({"cel": {"expression": "device.attributes['gpu.nvidia.com'].x > "}}),
    st.just({"name": "s", "deviceClassName": "gpu.nvidia.com", "count": 40}),
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def mutate(obj: Any, path: tuple[Any, ...], action: str, junk: Any) -> Any:
    """A copy of ``obj`` with the value at ``path`` dropped, replaced by ``junk``, or (``add``) with
    ``junk`` added to the object or list there."""
    obj = copy.deepcopy(obj)
    if not path:
        return junk if action == "replace" else obj
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    target = parent[path[-1]]
    if action == "drop":
        del parent[path[-1]]
    elif action == "add" and isinstance(target, list):
        target.append(junk)
    elif action == "add" and isinstance(target, dict):
        target["extra"] = junk
    else:
        parent[path[-1]] = junk
    return obj


@st.composite
def mutated_claims(draw: Any) -> Any:
    """A valid claim or template with one to three parts dropped, replaced or added to."""
    obj = draw(st.sampled_from([CLAIM, TEMPLATE, ALLOCATED]))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = list(_paths(obj))
        if not paths or not isinstance(obj, dict):
            break
        path = draw(st.sampled_from(paths))
        obj = mutate(obj, path, draw(st.sampled_from(["drop", "replace", "add"])), draw(_junk))
    return obj


def _config_with_a_null_entry() -> dict[str, Any]:
    # Found by this test: a null config entry passed the check, and an allocation that fit read it.
    obj = copy.deepcopy(CLAIM)
    del obj["spec"]["devices"]["requests"][0]
    obj["spec"]["devices"]["config"].append(None)
    return obj


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
@given(obj=mutated_claims(), empty=st.booleans())
@example(obj=_config_with_a_null_entry(), empty=False)
def test_what_passes_the_check_is_linted_and_diagnosed_without_an_exception(obj, empty):
    state = empty_fleet() if empty else fleet()
    if not isinstance(obj, dict) or obj.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
        with pytest.raises(NormalizeError):
            clean_pasted_claim(obj)
        return
    with contextlib.suppress(NormalizeError):
        cleaned = clean_pasted_claim(obj)
        event("passes the check")
        lint_object(cleaned, state)
        assert diagnose(state, cleaned).as_dict()["category"]


@pytest.mark.parametrize("state", [fleet, empty_fleet])
def test_a_stored_claim_without_requests_fits_even_on_an_empty_fleet(state):
    # The API server stores such a claim; the diagnosis once indexed its (empty) request list.
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "nothing", "namespace": "ml"},
        "spec": {"devices": {"requests": []}},
    }
    result = diagnose(state(), claim)
    assert (result.category, result.summary) == (
        "fits",
        "ml/nothing requests no devices: there is nothing to allocate.",
    )


def test_an_unsupported_api_version_is_refused_naming_it():
    classic = {**copy.deepcopy(CLAIM), "apiVersion": "resource.k8s.io/v1alpha2"}
    with pytest.raises(NormalizeError) as caught:
        check_claim_object(classic)
    assert caught.value.field == "apiVersion"
    assert "classic DRA" in caught.value.problem
    old = {**copy.deepcopy(CLAIM), "apiVersion": "resource.k8s.io/v1beta1"}
    old["spec"]["devices"]["requests"][0] = {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 1}
    check_claim_object(old)
