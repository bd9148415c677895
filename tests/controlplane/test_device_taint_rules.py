"""DeviceTaintRules (``resource.k8s.io/v1``, GA in 1.37) on the real control plane: the scheduler keeps a
claim off a device a rule taints unless the claim tolerates it, and claimscope says so, live from the API
server and from its mirror (FINDINGS.md, "DeviceTaintRules")."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from fleet.models import Device, GpuState
from simulator import nvidia
from tests.controlplane.kube import Kube, Obj
from tests.controlplane.launcher import ControlPlane
from tests.controlplane.nodes import for_create
from tests.controlplane.publisher import FleetPublisher
from tests.controlplane.test_scheduler_dra import CANNOT_ALLOCATE, claim_of, wait_bound, wait_not_scheduled

pytestmark = [pytest.mark.controlplane, pytest.mark.django_db]

TAINT = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}
LABEL = "claimscope.test/case"


def one_gpu_node(kube: Kube, name: str) -> None:
    publisher = FleetPublisher(kube)
    publisher.device_classes()
    publisher.gpu_node(name, "H100", gpus=1, labels={LABEL: name})


def pinned_pod(kube: Kube, namespace: str, node: str, request: Obj) -> None:
    kube.create(for_create(nvidia.claim_template(namespace, "one", [request])))
    pod = nvidia.pod_object(namespace, "job", [("gpus", "one")])
    pod["spec"]["nodeSelector"] = {LABEL: node}  # only this test's node: other tests' nodes never compete
    kube.create(for_create(pod))


def rule(name: str, node: str, effect: str = "NoSchedule") -> Obj:
    taint = {**TAINT, "effect": effect}
    obj = nvidia.device_taint_rule(name, taint, driver="gpu.nvidia.com", pool=node, device="gpu-0")
    return for_create(obj)


def explain_live(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    out = StringIO()
    call_command(
        "explain", f"{namespace}/job", kubeconfig=str(control_plane.kubeconfig), json=True, stdout=out
    )
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def import_fleet(kube: Kube, namespace: str, path: Path, cluster: str) -> None:
    """What the API server lists now, imported as a user would (``import_snapshot``)."""
    objs: list[Obj] = []
    for kind in ("Node", "DeviceClass", "ResourceSlice", "DeviceTaintRule"):
        objs += [{"kind": kind, **o} for o in kube.list(kind)]
    objs += [{"kind": "ResourceClaim", **o} for o in kube.list("ResourceClaim", namespace)]
    for o in objs:
        o.setdefault("apiVersion", "v1" if o["kind"] == "Node" else "resource.k8s.io/v1")
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objs}))
    call_command("import_snapshot", str(path), cluster=cluster, stdout=StringIO())


def test_a_claim_whose_only_device_a_rule_taints_stays_pending_and_the_diagnosis_names_the_rule(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    kube.create(rule("drain-rules-a", "rules-a"))
    one_gpu_node(kube, "rules-a")
    pinned_pod(kube, namespace, "rules-a", nvidia.exactly_request("gpu", "gpu.nvidia.com", 1))
    assert CANNOT_ALLOCATE in wait_not_scheduled(kube, namespace, "job")
    stored = kube.get("DeviceTaintRule", "drain-rules-a")
    assert stored["spec"]["taint"]["timeAdded"]  # the API server stamps it

    result = explain_live(control_plane, namespace)
    assert result["category"] == "taint"
    assert (
        "example.com/maintenance=planned:NoSchedule by DeviceTaintRule drain-rules-a (1)" in result["summary"]
    )
    assert CANNOT_ALLOCATE in result["scheduler_message"]

    # The mirror counts the device as tainted, and so does the per-GPU read model.
    import_fleet(kube, namespace, tmp_path / "fleet.yaml", "rules")
    device = Device.objects.get(cluster__name="rules", pool="rules-a", name="gpu-0")
    assert device.tainted and device.taints[-1]["deviceTaintRule"] == "drain-rules-a"
    assert GpuState.objects.get(cluster__name="rules", pool="rules-a").tainted

    # Deleting the rule lets the scheduler place the pod; claimscope agrees with the placement.
    kube.delete("DeviceTaintRule", "drain-rules-a")
    pod = wait_bound(kube, namespace, "job")
    assert pod["spec"]["nodeName"] == "rules-a"
    (placed,) = claim_of(kube, pod)["status"]["allocation"]["devices"]["results"]
    assert placed["device"] == "gpu-0"


def test_a_claim_tolerating_the_rules_taint_gets_the_device(
    control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    kube.create(rule("drain-rules-b", "rules-b"))
    one_gpu_node(kube, "rules-b")
    tolerant = nvidia.exactly_request(
        "gpu", "gpu.nvidia.com", 1, tolerations=[{"key": TAINT["key"], "operator": "Exists"}]
    )
    # Before the pod exists, the diagnosis of the template says it fits on the tainted device.
    template = tmp_path / "template.yaml"
    template.write_text(yaml.safe_dump(nvidia.claim_template(namespace, "one", [tolerant])))
    out = StringIO()
    call_command("explain", str(template), kubeconfig=str(control_plane.kubeconfig), json=True, stdout=out)
    verdict = json.loads(out.getvalue())
    assert verdict["category"] == "fits" and verdict["placement"]["node"] == "rules-b"
    pinned_pod(kube, namespace, "rules-b", tolerant)
    pod = wait_bound(kube, namespace, "job")
    (result,) = claim_of(kube, pod)["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == ("rules-b", "gpu-0")
    # The scheduler copies the tolerations it used into the result.
    assert result["tolerations"] == [{"key": TAINT["key"], "operator": "Exists"}]


def test_an_informational_rule_keeps_nothing_away(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    kube.create(rule("note-rules-c", "rules-c", effect="None"))
    one_gpu_node(kube, "rules-c")
    pinned_pod(kube, namespace, "rules-c", nvidia.exactly_request("gpu", "gpu.nvidia.com", 1))
    assert wait_bound(kube, namespace, "job")["spec"]["nodeName"] == "rules-c"
