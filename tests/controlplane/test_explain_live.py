"""``manage.py explain NS/NAME --kubeconfig FILE`` reads the claim and the fleet from a real API server."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from simulator import nvidia
from tests.controlplane.kube import Kube, wait_for
from tests.controlplane.launcher import ControlPlane
from tests.controlplane.nodes import for_create
from tests.controlplane.publisher import FleetPublisher

pytestmark = pytest.mark.controlplane


def test_explain_reads_a_pending_pod_and_the_fleet_from_the_api_server(
    control_plane: ControlPlane, kube: Kube, namespace: str
) -> None:
    publisher = FleetPublisher(kube)
    publisher.device_classes()
    publisher.gpu_node("live-a", "H100", gpus=1)
    want = nvidia.exactly_request("gpu", "gpu.nvidia.com", 2)
    kube.create(for_create(nvidia.claim_template(namespace, "two", [want])))
    kube.create(for_create(nvidia.pod_object(namespace, "job", [("gpus", "two")])))

    def unschedulable() -> bool:
        pod = kube.get("Pod", "job", namespace)
        return any(c.get("reason") == "Unschedulable" for c in pod.get("status", {}).get("conditions", []))

    wait_for("the pod to be unschedulable", unschedulable, timeout=60)
    out = StringIO()
    call_command(
        "explain", f"{namespace}/job", kubeconfig=str(control_plane.kubeconfig), json=True, stdout=out
    )
    result = json.loads(out.getvalue())
    assert result["category"] == "capacity"
    assert result["pod"] == f"{namespace}/job"
    assert result["summary"].startswith("Request gpu needs 2: 1 devices match (1 H100), 1 free")
    assert "cannot allocate all claims" in result["scheduler_message"]


def test_explain_names_a_kubeconfig_it_cannot_use(control_plane: ControlPlane) -> None:
    with pytest.raises(CommandError, match="context 'nope'"):
        call_command("explain", "ns/x", kubeconfig=str(control_plane.kubeconfig), context="nope")
