"""Inputs where the diagnosis once disagreed with kube-scheduler 1.37.2 or upstream's allocator (issue 22).

Each test names the upstream behaviour it checks; the scheduler's answers are recorded in
tests/controlplane/FINDINGS.md."""

from __future__ import annotations

import copy
from typing import Any

from claims.diagnosis import diagnose
from claims.fleetstate import FleetState, lean_object
from simulator import nvidia
from tests.diagnosis.fleet import GPU, claim, held, node, state

Obj = dict[str, Any]


def gpu(count: int = 1, selectors: tuple[str, ...] = (), **kwargs: Any) -> Obj:
    return nvidia.exactly_request("gpu", "gpu.nvidia.com", count, selectors, **kwargs)


def _admin_namespace_claim(requests: list[Obj]) -> Obj:
    return claim(requests)


def test_admin_access_on_busy_gpus_fits_because_existing_allocations_do_not_count() -> None:
    fleet = state(
        node("a", "H100", gpus=2), held("x", "a", ["gpu-0", "gpu-1"], "2026-03-06T10:00:00Z", pod=None)
    )
    result = diagnose(fleet, claim([gpu(1, admin_access=True)]))
    assert result.category == "fits", result.summary
    assert result.placement is not None
    assert result.placement["devices"][0]["device"] == "gpu-0"
    assert not any("delet" in s for s in result.suggestions)


def test_admin_access_still_respects_taints() -> None:
    taint = {"key": "maintenance", "value": "true", "effect": "NoSchedule"}
    parts = node("a", "H100", gpus=1, taints={0: [taint]})
    result = diagnose(state(parts), claim([gpu(1, admin_access=True)]))
    assert result.category == "taint"


def test_list_valued_attributes_do_not_break_selectors_on_that_device() -> None:
    parts = node("a", "H100", gpus=2)
    for device in parts[1]["spec"]["devices"]:
        device["attributes"]["numaNode"] = {"ints": [0, 1]}
    fleet = state(parts)
    plain = diagnose(fleet, claim([gpu(1, ("device.driver == 'gpu.nvidia.com'",))]))
    assert plain.category == "fits", plain.summary
    numa = diagnose(fleet, claim([gpu(2, (f"1 in {GPU}.numaNode",))]))
    assert numa.category == "fits", numa.summary
    miss = diagnose(fleet, claim([gpu(1, (f"3 in {GPU}.numaNode",))]))
    assert miss.category == "no-match"


def test_a_class_selector_that_does_not_compile_is_a_cel_error_not_a_crash() -> None:
    fleet = state(node("a", "H100", gpus=1))
    fleet.objects["DeviceClass"] = copy.deepcopy(fleet.objects["DeviceClass"])
    for device_class in fleet.objects["DeviceClass"]:
        if device_class["metadata"]["name"] == "gpu.nvidia.com":
            device_class["spec"]["selectors"] = [
                {"cel": {"expression": "device.attributes['x'].y >= quantity('1')"}}
            ]
    result = diagnose(fleet, claim([gpu()]))
    assert result.category == "cel-error"
    assert "class gpu.nvidia.com: selector #0: CEL compile error" in result.scheduler_message


def test_an_invalid_pool_is_reported_as_the_scheduler_does() -> None:
    parts = node("a", "H100", gpus=2)
    devices = parts[1]["spec"]["devices"]
    devices[1] = {**copy.deepcopy(devices[1]), "name": devices[0]["name"]}
    result = diagnose(state(parts, held("x", "a", ["gpu-0"], "2026-03-06T10:00:00Z")), claim([gpu()]))
    assert result.category == "pool", result.summary
    assert result.scheduler_message == "invalid resource pools were encountered"
    assert "duplicate device gpu-0" in result.summary
    assert "team/x" not in result.summary


def _shareable(parts: list[Obj]) -> list[Obj]:
    for device in parts[1]["spec"]["devices"]:
        device["allowMultipleAllocations"] = True
    return parts


def test_a_shareable_device_allocated_without_a_share_id_is_not_offered_for_sharing() -> None:
    fleet = state(_shareable(node("a", "H100", gpus=1)), held("x", "a", ["gpu-0"], "2026-03-06T10:00:00Z"))
    result = diagnose(fleet, claim([gpu(capacity={"memory": "1Gi"})]))
    assert result.category == "capacity", result.summary
    assert "held by team/x" in result.summary


def _share(name: str, memory: str) -> Obj:
    obj = held(name, "a", ["gpu-0"], "2026-03-06T10:00:00Z")
    result = obj["status"]["allocation"]["devices"]["results"][0]
    result["shareID"] = f"share-{name}"
    result["consumedCapacity"] = {"memory": memory}
    return obj


def test_exhausted_consumable_capacity_names_the_sharers() -> None:
    fleet = state(_shareable(node("a", "H100", gpus=1)), _share("x", "80Gi"))
    result = diagnose(fleet, claim([gpu(capacity={"memory": "1Gi"})]))
    assert result.category == "capacity", result.summary
    assert "held by team/x" in result.summary
    assert "at most" not in result.summary
    fits = diagnose(
        state(_shareable(node("a", "H100", gpus=1)), _share("x", "40Gi")),
        claim([gpu(capacity={"memory": "1Gi"})]),
    )
    assert fits.category == "fits"


def test_a_capacity_request_over_the_request_policy_maximum_matches_no_device() -> None:
    parts = _shareable(node("a", "H100", gpus=1))
    memory = parts[1]["spec"]["devices"][0]["capacity"]["memory"]
    memory["requestPolicy"] = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "10Gi"}}
    result = diagnose(state(parts), claim([gpu(capacity={"memory": "20Gi"})]))
    assert result.category == "no-match", result.summary
    assert "outside the device's requestPolicy" in result.summary
    assert "at most" not in result.summary
    assert not any("Wait for a holder" in s for s in result.suggestions)


def test_all_mode_with_one_device_held_names_the_holder() -> None:
    fleet = state(node("a", "H100", gpus=2), held("x", "a", ["gpu-1"], "2026-03-06T10:00:00Z"))
    result = diagnose(fleet, claim([gpu(allocation_mode="All")]))
    assert result.category == "capacity", result.summary
    assert "held by team/x" in result.summary
    assert "at most" not in result.summary


def test_all_mode_aborts_on_a_later_nodes_incomplete_pool_even_if_the_first_node_fits() -> None:
    later = node("b", "H100", gpus=1)
    later[1]["spec"]["pool"]["resourceSliceCount"] = 2
    fleet = state(node("a", "H100", gpus=1), later)
    result = diagnose(fleet, claim([gpu(allocation_mode="All")]))
    assert result.category == "pool", result.summary
    assert result.scheduler_message.endswith("resource pool gpu.nvidia.com/b is currently being updated")


def test_all_mode_over_32_devices_on_a_later_node_aborts_even_if_the_first_node_fits() -> None:
    big = node("b", "H100", gpus=8)
    devices = big[1]["spec"]["devices"]
    for i in range(8, 40):
        devices.append({**copy.deepcopy(devices[0]), "name": f"gpu-{i}"})
    fleet = state(node("a", "H100", gpus=1), big)
    result = diagnose(fleet, claim([gpu(allocation_mode="All")]))
    assert result.category == "too-many", result.summary
    assert "request gpu: adding 40 devices exceeds the claim limit of 32" in result.scheduler_message


def _v1beta1(kind: str) -> Obj:
    spec = {
        "devices": {
            "requests": [
                {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2},
                {
                    "name": "alt",
                    "firstAvailable": [{"name": "one", "deviceClassName": "gpu.nvidia.com", "count": 1}],
                },
            ]
        }
    }
    body: Obj = {"spec": spec} if kind == "ResourceClaimTemplate" else spec
    return {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": kind,
        "metadata": {"namespace": "team", "name": "old"},
        "spec": body,
    }


def test_v1beta1_claims_and_templates_are_read_with_their_request_level_fields() -> None:
    fleet = state(node("a", "H100", gpus=3))
    for kind in ("ResourceClaim", "ResourceClaimTemplate"):
        result = diagnose(fleet, _v1beta1(kind))
        assert result.category == "fits", (kind, result.summary)
        assert result.placement is not None
        assert [d["request"] for d in result.placement["devices"]] == ["gpu", "gpu", "alt/one"]
    too_big = _v1beta1("ResourceClaim")
    too_big["spec"]["devices"]["requests"][0]["count"] = 3
    assert diagnose(fleet, too_big).category == "capacity"


def test_a_classic_dra_v1alpha2_claim_is_refused_naming_the_api_version() -> None:
    obj = {
        "apiVersion": "resource.k8s.io/v1alpha2",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team", "name": "classic"},
        "spec": {"resourceClassName": "gpu.nvidia.com"},
    }
    result = diagnose(state(node("a", "H100", gpus=1)), obj)
    assert result.category == "unsupported"
    assert "resource.k8s.io/v1alpha2 is classic DRA" in result.summary


def _extended_fleet(*parts: list[Obj] | Obj) -> Any:
    classes = copy.deepcopy(nvidia.device_classes())
    for device_class in classes:
        if device_class["metadata"]["name"] == "gpu.nvidia.com":
            device_class["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    return FleetState.from_objects(
        [*classes, *(o for p in parts for o in (p if isinstance(p, list) else [p]))]
    )


def _gpu_pod(limit: int, resource: str = "nvidia.com/gpu") -> Obj:
    pod = nvidia.pod_object("team", "legacy", [])
    pod["spec"].pop("resourceClaims", None)
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(limit), "cpu": "1"}}
    return pod


def test_a_pod_asking_for_a_dra_extended_resource_gets_the_schedulers_claim() -> None:
    fits = diagnose(_extended_fleet(node("a", "H100", gpus=2)), _gpu_pod(2))
    assert fits.category == "fits", fits.summary
    assert fits.placement is not None
    assert [d["request"] for d in fits.placement["devices"]] == ["container-0-request-1"] * 2
    busy = _extended_fleet(
        node("a", "H100", gpus=2), held("x", "a", ["gpu-0", "gpu-1"], "2026-03-06T10:00:00Z")
    )
    result = diagnose(busy, _gpu_pod(1))
    assert result.category == "capacity", result.summary
    assert "held by team/x" in result.summary


def test_an_extended_resource_without_a_device_class_is_not_dra() -> None:
    result = diagnose(state(node("a", "H100", gpus=1)), _gpu_pod(1, "example.com/fpga"))
    assert result.category == "fits"
    assert result.summary.startswith("All claims of pod team/legacy")


def test_a_lean_pod_keeps_what_its_extended_resource_claim_is_built_from() -> None:
    pod = _gpu_pod(2)
    pod["spec"]["containers"][0]["env"] = [{"name": "X", "value": "1"}]
    lean = lean_object(copy.deepcopy(pod), {})
    assert lean["spec"]["containers"] == [
        {"name": "main", "resources": pod["spec"]["containers"][0]["resources"]}
    ]
    fleet = _extended_fleet(node("a", "H100", gpus=2))
    assert diagnose(fleet, lean).as_dict() == diagnose(fleet, pod).as_dict()


def test_a_node_less_device_no_node_reaches_is_named_so() -> None:
    parts = node("a", "H100", gpus=1)
    fabric = copy.deepcopy(parts[1])
    fabric["metadata"]["name"] = "fabric-0"
    spec = fabric["spec"]
    del spec["nodeName"]
    spec["pool"]["name"] = "fabric"
    spec["nodeSelector"] = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r9"]}]}]
    }
    fleet = state(parts, fabric, held("x", "a", ["gpu-0"], "2026-03-06T10:00:00Z"))
    result = diagnose(fleet, claim([gpu()]))
    assert result.category == "capacity", result.summary
    assert "no node the pod can use reaches them" in result.summary
    assert "at most" not in result.summary


def test_a_v1beta1_fleet_file_with_basic_devices_is_read_as_v1() -> None:
    parts = node("a", "H100", gpus=2)
    old = copy.deepcopy(parts[1])
    old["apiVersion"] = "resource.k8s.io/v1beta1"
    old["spec"]["devices"] = [{"name": d.pop("name"), "basic": d} for d in old["spec"]["devices"]]
    result = diagnose(state([parts[0], old]), claim([gpu(2)]))
    assert result.category == "fits", result.summary
