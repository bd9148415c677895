import contextlib
import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.normalize import (
    NormalizeError,
    is_stored,
    mig_compute_slices,
    model_family,
    normalize,
    normalize_claim,
    normalize_slice,
)
from simulator import nvidia


@pytest.mark.parametrize(
    ("product", "family"),
    [
        ("NVIDIA B200", "B200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GH200 480GB", "other"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA GB300", "GB300"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("Tesla T4", "other"),
        ("", "other"),
    ],
)
def test_model_family_comes_from_the_product_name(product, family):
    assert model_family(product) == family


@pytest.mark.parametrize(
    ("profile", "slices"), [("1g.10gb", 1), ("1g.10gb+me", 1), ("3g.40gb", 3), ("7g.80gb", 7), ("x", 0)]
)
def test_mig_compute_slices_is_the_n_of_ng(profile, slices):
    assert mig_compute_slices(profile) == slices


def _with_meta(obj, rv=1):
    obj = copy.deepcopy(obj)
    obj.setdefault("metadata", {}).setdefault("uid", "uid-" + obj["metadata"]["name"])
    obj["metadata"].setdefault("resourceVersion", str(rv))
    return obj


def test_full_gpu_slice_gives_one_gpu_device_per_gpu():
    (slice_obj,) = nvidia.node_slices("node-a", "B200", mode="full", gpus=8)
    record = normalize_slice(_with_meta(slice_obj))
    assert record.pool == "node-a" and record.node_name == "node-a"
    assert [d.kind for d in record.devices] == ["gpu"] * 8
    first = record.devices[0]
    assert first.model == "B200" and first.compute_slices == 7
    assert first.gpu_uuid == first.uuid and first.uuid.startswith("GPU-")
    assert first.memory_bytes and first.memory_bytes > 100 * 2**30
    assert first.gpu_minor == 0


def test_static_mig_devices_belong_to_their_parent_gpu():
    slices = nvidia.node_slices("node-m", "H100", mode="static-mig", layout="balanced", gpus=2)
    devices = [d for s in slices for d in normalize_slice(_with_meta(s)).devices]
    assert devices and all(d.kind == "mig" for d in devices)
    parents = {d.gpu_uuid for d in devices}
    assert len(parents) == 2
    for parent in parents:
        slices_used = sum(d.compute_slices for d in devices if d.gpu_uuid == parent)
        assert slices_used <= 7
    assert {d.mig_profile for d in devices} >= {"1g.10gb", "3g.40gb"}


def test_dynamic_mig_keeps_counters_and_the_full_gpu():
    slices = nvidia.node_slices("node-d", "H100", mode="dynamic-mig", gpus=1)
    records = [normalize_slice(_with_meta(s)) for s in slices]
    counters = [r for r in records if r.shared_counters]
    assert counters and not counters[0].devices
    devices = [d for r in records for d in r.devices]
    full = [d for d in devices if d.kind == "gpu"]
    assert len(full) == 1
    assert all(d.counters_consumed for d in devices)
    assert all(d.gpu_uuid == full[0].uuid for d in devices if d.kind == "mig")


def test_v1beta1_shapes_map_to_the_same_records():
    (slice_obj,) = nvidia.node_slices("node-a", "H200", mode="full", gpus=1)
    v1 = _with_meta(slice_obj)
    beta = copy.deepcopy(v1)
    beta["apiVersion"] = "resource.k8s.io/v1beta1"
    dev = beta["spec"]["devices"][0]
    beta["spec"]["devices"][0] = {
        "name": dev["name"],
        "basic": {"attributes": dev["attributes"], "capacity": dev["capacity"]},
    }
    assert normalize_slice(beta).devices == normalize_slice(v1).devices

    claim_v1 = {
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
                ]
            }
        },
    }
    claim_beta: Any = copy.deepcopy(claim_v1)
    claim_beta["spec"]["devices"]["requests"] = [
        {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}
    ]
    assert normalize_claim(claim_beta).spec == normalize_claim(claim_v1).spec


def test_first_available_alternatives_keep_their_order():
    claim = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig-or-gpu",
                        "firstAvailable": [
                            {"name": "small", "deviceClassName": "mig.nvidia.com"},
                            {"name": "full", "deviceClassName": "gpu.nvidia.com"},
                        ],
                    }
                ]
            }
        },
    }
    record = normalize_claim(claim)
    assert [a.name for a in record.spec.requests[0].alternatives] == ["small", "full"]
    assert record.state == "pending"


def test_claim_states():
    base = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
        "spec": {"devices": {"requests": []}},
    }
    allocation = {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
    }
    allocated = {**base, "status": {"allocation": allocation}}
    assert normalize_claim(allocated).state == "allocated"
    assert normalize_claim(allocated).node_name == "n1"
    reserved = {
        **base,
        "status": {"allocation": allocation, "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}]},
    }
    assert normalize_claim(reserved).state == "reserved"
    deleting: Any = copy.deepcopy(reserved)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert normalize_claim(deleting).state == "deallocating"


def test_a_malformed_object_names_itself_and_the_field():
    (slice_obj,) = nvidia.node_slices("node-a", "B200", mode="full", gpus=1)
    bad = _with_meta(slice_obj)
    bad["spec"]["pool"]["generation"] = "three"
    with pytest.raises(NormalizeError) as err:
        normalize("ResourceSlice", bad)
    assert err.value.field == "spec.pool.generation"
    assert slice_obj["metadata"]["name"] in str(err.value)


@pytest.mark.parametrize(
    ("namespace", "name", "field"),
    [
        ("ml", "<b>x</b>", "metadata.name"),
        ("ml", "=1+2", "metadata.name"),
        ("ml", "a/b", "metadata.name"),
        ("ml", "Upper", "metadata.name"),
        ("=cmd", "ok", "metadata.namespace"),
        ("a.b", "ok", "metadata.namespace"),
    ],
)
def test_a_name_the_api_server_would_refuse_is_refused_naming_the_field(namespace, name, field):
    obj = {
        "metadata": {"name": name, "namespace": namespace, "uid": "u", "resourceVersion": "1"},
        "spec": {"devices": {"requests": []}},
    }
    with pytest.raises(NormalizeError) as err:
        normalize("ResourceClaim", obj)
    assert err.value.field == field


def test_resource_versions_up_to_128_bits_are_kept_exactly():
    obj = {"metadata": {"name": "n", "uid": "u", "resourceVersion": str(2**128 - 1)}}
    assert normalize("Node", obj).meta.resource_version == 2**128 - 1
    obj["metadata"]["resourceVersion"] = str(2**128)
    with pytest.raises(NormalizeError):
        normalize("Node", obj)


def test_only_gpu_pods_and_relevant_events_are_stored():
    assert is_stored("Pod", {"spec": {"resourceClaims": [{"name": "gpu"}]}})
    assert is_stored("Pod", {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
    assert not is_stored("Pod", {"spec": {"containers": [{"name": "web"}]}})
    assert is_stored("Event", {"reason": "FailedScheduling"})
    assert not is_stored("Event", {"reason": "Pulled"})


# ---------------------------------------------------------------------------------------------- fuzzing

_SAMPLES = {
    "ResourceSlice": _with_meta(
        nvidia.node_slices("fz", "H100", mode="static-mig", layout="mixed", gpus=2)[0]
    ),
    "DeviceClass": _with_meta(nvidia.device_classes()[0]),
    "Node": _with_meta(nvidia.node_object("fz", "B200", clique="c1")),
    "ResourceClaim": {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "a",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [{"cel": {"expression": "true"}}],
                        },
                    },
                    {"name": "b", "firstAvailable": [{"name": "s", "deviceClassName": "mig.nvidia.com"}]},
                ],
                "constraints": [{"matchAttribute": "gpu.nvidia.com/parentUUID"}],
            }
        },
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "a", "driver": "d", "pool": "p", "device": "x"}]}
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
        },
    },
    "Pod": {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pu", "resourceVersion": "7"},
        "spec": {"nodeName": "n", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}
            ],
        },
    },
    "Event": {
        "metadata": {"name": "e", "namespace": "ns", "uid": "eu", "resourceVersion": "9"},
        "reason": "FailedScheduling",
        "message": "0/3 nodes are available: 3 cannot allocate all claims.",
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns", "uid": "pu"},
        "count": 3,
        "lastTimestamp": "2026-11-30T10:00:00Z",
    },
}

_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.just("x" * 100_000),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _mutate(obj, path, action, junk):
    obj = copy.deepcopy(obj)
    if not path:
        return junk
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    if action == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = junk
    return obj


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_objects_raise_only_normalize_error(data):
    kind = data.draw(st.sampled_from(sorted(_SAMPLES)))
    sample = _SAMPLES[kind]
    paths = list(_paths(sample))
    mutated = sample
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = list(_paths(mutated))
        path = data.draw(st.sampled_from(paths))
        mutated = _mutate(mutated, path, data.draw(st.sampled_from(["drop", "replace"])), data.draw(_junk))
    with contextlib.suppress(NormalizeError):
        normalize(kind, mutated)


def test_odd_pod_shapes_are_not_gpu_pods_rather_than_errors():
    assert not is_stored("Pod", {"spec": {"containers": {"a": 1}}})
    assert not is_stored("Pod", {"spec": {"containers": [{"resources": {"limits": ["x"]}}]}})
    assert not is_stored(
        "Pod", {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": True}}}]}}
    )


def test_unquoted_yaml_timestamps_stay_strings():
    from fleet.snapshot import read_text

    text = (
        "kind: Node\n"
        "metadata: {name: a, uid: u, resourceVersion: '1', creationTimestamp: 2026-01-01T00:00:00Z}"
    )
    (obj,) = read_text(text)
    assert normalize("Node", obj).meta.created_at is not None
    assert obj["metadata"]["creationTimestamp"] == "2026-01-01T00:00:00Z"


def test_huge_quantity_exponents_are_refused_quickly():
    from fleet.quantity import QuantityError, parse_quantity

    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("1e999999999")


def test_device_attributes_read_the_same_on_the_fast_path_and_the_general_one():
    (slice_obj,) = nvidia.node_slices("node-a", "H100", mode="full", gpus=1)
    obj = _with_meta(slice_obj)
    device = obj["spec"]["devices"][0]
    device["attributes"].update(
        {
            "both": {"version": "1.2.3", "string": "wins"},  # two values: the first in the type order
            "list": {"strings": ["a", "b"]},
            "number": {"int": 3},
        }
    )
    (record,) = normalize_slice(obj).devices
    assert record.attributes["both"] == "wins"
    assert record.attributes["list"] == ["a", "b"] and record.attributes["number"] == 3
    assert record.attributes["productName"] == "NVIDIA H100 80GB HBM3" and record.model == "H100"
    device["attributes"]["odd"] = {"float": 1.5}
    with pytest.raises(NormalizeError, match=r"spec\.devices\[0\]\.attributes\.odd"):
        normalize_slice(obj)
    device["attributes"]["odd"] = "not an object"
    with pytest.raises(NormalizeError, match=r"spec\.devices\[0\]\.attributes\.odd"):
        normalize_slice(obj)


def test_memory_quantities_are_read_per_value_type():
    (slice_obj,) = nvidia.node_slices("node-a", "H100", mode="full", gpus=2)
    obj = _with_meta(slice_obj)
    first, second = obj["spec"]["devices"]
    first["capacity"]["memory"] = {"value": "1"}
    second["capacity"]["memory"] = {"value": True}  # not a quantity: no memory, even though True == 1
    a, b = normalize_slice(obj).devices
    assert (a.memory_bytes, b.memory_bytes) == (1, None)


def test_it_normalizes_a_device_taint_rule_and_names_a_missing_taint_key() -> None:
    from fleet.normalize import normalize_device_taint_rule

    taint = {"key": "example.com/maintenance", "effect": "NoSchedule", "timeAdded": "2026-12-01T00:00:00Z"}
    rule = nvidia.device_taint_rule("drain", taint, pool="node-a")
    rule["metadata"]["resourceVersion"] = "7"
    record = normalize_device_taint_rule(rule)
    assert record.selector == {"driver": None, "pool": "node-a", "device": None}
    assert record.taint == taint
    no_selector = copy.deepcopy(rule)
    del no_selector["spec"]["deviceSelector"]
    assert normalize_device_taint_rule(no_selector).selector is None
    broken = copy.deepcopy(rule)
    del broken["spec"]["taint"]["key"]
    with pytest.raises(NormalizeError, match=r"spec\.taint\.key"):
        normalize_device_taint_rule(broken)


def test_a_published_taint_keeps_only_the_api_fields() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule", "deviceTaintRule": "forged", "extra": 1}
    slice_obj = nvidia.node_slices("a", "H100", gpus=1, taints={0: [taint]})[0]
    slice_obj["metadata"]["resourceVersion"] = "3"
    (device,) = normalize("ResourceSlice", slice_obj).devices  # type: ignore[union-attr]
    assert device.taints == [{"key": "k", "value": "v", "effect": "NoSchedule"}]
