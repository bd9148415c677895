"""Devices with binding conditions (KEP-5007, DRADeviceBindingConditions, beta in 1.37) on the real
control plane: the allocator tries their pools last, and a pod allocated such a device is bound only once
the conditions are true on its claim (FINDINGS.md, "Binding conditions")."""

from __future__ import annotations

import copy
import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from simulator import nvidia
from tests.controlplane.kube import Kube, Obj, wait_for
from tests.controlplane.launcher import ControlPlane
from tests.controlplane.nodes import for_create, register_node
from tests.controlplane.publisher import FleetPublisher
from tests.controlplane.test_scheduler_dra import claim_of, scheduled_condition, wait_bound

pytestmark = pytest.mark.controlplane

LABEL = "claimscope.test/case"
CONDITIONS = {
    "bindingConditions": ["example.com/attached"],
    "bindingFailureConditions": ["example.com/failed"],
}


def publish(kube: Kube, node_name: str) -> None:
    """A node with two pools of one H100 each: ``a-<node>`` (its GPU has binding conditions; sorts first)
    and ``<node>`` (none)."""
    publisher = FleetPublisher(kube)
    publisher.device_classes()
    node = register_node(kube, nvidia.node_object(node_name, "H100", labels={LABEL: node_name}, gpus=2))
    plain = nvidia.node_slices(node_name, "H100", gpus=1)
    bound = copy.deepcopy(plain)
    for s in bound:
        s["metadata"]["name"] = "a-" + s["metadata"]["name"]
        s["spec"]["pool"]["name"] = f"a-{node_name}"
        for device in s["spec"]["devices"]:
            device.update(copy.deepcopy(CONDITIONS))
    for s in [*bound, *plain]:
        publisher.publish_slice(s, node)


def pinned_pod(kube: Kube, namespace: str, name: str, node: str, count: int) -> None:
    request = nvidia.exactly_request("gpu", "gpu.nvidia.com", count)
    kube.create(for_create(nvidia.claim_template(namespace, name, [request])))
    pod = nvidia.pod_object(namespace, name, [("gpus", name)])
    pod["spec"]["nodeSelector"] = {LABEL: node}
    kube.create(for_create(pod))


def explain_file(control_plane: ControlPlane, path: Path, obj: Obj) -> dict[str, Any]:
    path.write_text(yaml.safe_dump(obj))
    out = StringIO()
    call_command("explain", str(path), kubeconfig=str(control_plane.kubeconfig), json=True, stdout=out)
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def test_the_pool_without_binding_conditions_is_used_first_and_the_engine_agrees(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    publish(kube, "bind-a")
    template = nvidia.claim_template(namespace, "one", [nvidia.exactly_request("gpu", "gpu.nvidia.com", 1)])
    verdict = explain_file(control_plane, tmp_path / "one.yaml", template)
    assert verdict["category"] == "fits"
    assert [(d["pool"], d["device"]) for d in verdict["placement"]["devices"]] == [("bind-a", "gpu-0")]
    pinned_pod(kube, namespace, "one", "bind-a", 1)
    pod = wait_bound(kube, namespace, "one")
    (result,) = claim_of(kube, pod)["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == ("bind-a", "gpu-0")
    assert "bindingConditions" not in result


def explain_live(control_plane: ControlPlane, target: str) -> dict[str, Any]:
    out = StringIO()
    call_command("explain", target, kubeconfig=str(control_plane.kubeconfig), json=True, stdout=out)
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def import_fleet(kube: Kube, namespace: str, path: Path) -> None:
    """What the API server lists now (the pod and its claim too), imported as a user would."""
    objs: list[Obj] = []
    for kind in ("Node", "DeviceClass", "ResourceSlice"):
        objs += [{"kind": kind, **o} for o in kube.list(kind)]
    for kind in ("ResourceClaim", "Pod"):
        objs += [{"kind": kind, **o} for o in kube.list(kind, namespace)]
    for o in objs:
        o.setdefault("apiVersion", "v1" if o["kind"] in ("Node", "Pod") else "resource.k8s.io/v1")
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objs}))
    call_command("import_snapshot", str(path), cluster="binding", stdout=StringIO())


@pytest.mark.django_db
def test_a_pod_allocated_a_device_with_binding_conditions_waits_for_them_and_the_diagnosis_says_so(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    from claims.diagnosis import diagnose
    from claims.fleetstate import FleetState

    publish(kube, "bind-b")
    pinned_pod(kube, namespace, "two", "bind-b", 2)  # needs both GPUs: the one with conditions too

    def pending_event() -> Obj | None:
        events = kube.list("Event", namespace)
        return next((e for e in events if e.get("reason") == "BindingConditionsPending"), None)

    event = wait_for("the BindingConditionsPending event", pending_event, timeout=60)
    assert event["message"] == "waiting for binding conditions for device on node bind-b"
    pod = kube.get("Pod", "two", namespace)
    assert not pod["spec"].get("nodeName") and scheduled_condition(pod) is None
    assert pod["status"]["nominatedNodeName"] == "bind-b"
    claim = claim_of(kube, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r.get("bindingConditions")) for r in results] == [
        ("bind-b", None),
        ("a-bind-b", ["example.com/attached"]),
    ]
    waiting = f"device gpu.nvidia.com/a-bind-b/gpu-0 of {namespace}/{claim['metadata']['name']} waits for "
    waiting += "example.com/attached to be True"
    live = explain_live(control_plane, f"{namespace}/two")
    assert live["category"] == "fits" and waiting in live["summary"]
    assert "binding controller" in live["suggestions"][0]
    # The mirror keeps the conditions (the slices' and claims' stored objects): the diagnosis task's lean
    # state says the same.
    import_fleet(kube, namespace, tmp_path / "fleet.yaml")
    with FleetState.from_db("binding", lean=True) as state:
        assert waiting in diagnose(state, state.find("Pod", namespace, "two") or {}).summary

    # The binding controller reports the device attached: the scheduler binds the pod.
    device_status = {
        "driver": "gpu.nvidia.com",
        "pool": "a-bind-b",
        "device": "gpu-0",
        "conditions": [
            {
                "type": "example.com/attached",
                "status": "True",
                "reason": "Attached",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    kube.patch(
        "ResourceClaim",
        claim["metadata"]["name"],
        {"status": {"devices": [device_status]}},
        namespace,
        subresource="status",
    )
    assert wait_bound(kube, namespace, "two")["spec"]["nodeName"] == "bind-b"
    assert explain_live(control_plane, f"{namespace}/two")["summary"] == (
        f"All claims of pod {namespace}/two are allocated."
    )
