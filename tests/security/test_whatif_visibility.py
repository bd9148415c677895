""" "Will it fit?" (the pending page's form and ``POST /api/v1/whatif``) never looks at the pods of another
namespace: a user who pastes a claim named after a foreign one learns neither what its pod's scheduler said
nor whether such a pod exists. Scheduler text the user may see reaches them intact."""

from __future__ import annotations

import json
from html import unescape
from itertools import count
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from fleet import ingest
from fleet.access.visibility import HIDDEN_REF, Visibility, redact_diagnosis, redact_text
from fleet.models import NamespaceGrant
from fleet.normalize import normalize
from simulator import nvidia

CLUSTER = "sim"
SECRET = "SECRET-PAYROLL-INFO"
RATIO = "0/1 nodes are available: 1 cannot allocate all claims."
# Not a DRA reason: the diagnosis quotes it in its summary ("Still pending for a non-DRA reason: ...").
AFFINITY = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."


def _unschedulable(message: str) -> dict[str, str]:
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}


@pytest.fixture
def fleet() -> None:
    """One H100 node with two free GPUs; pod ``secret/payroll-trainer`` uses claim ``job`` and may only run
    on a node that does not exist (so, were its pod looked at, ``secret/job`` would not fit anywhere);
    pod ``research/trainer`` uses claim ``job`` of its own namespace."""
    cluster = ingest.get_or_create_cluster(CLUSTER)
    versions = count(10)

    def put(kind: str, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(versions))
        ingest.apply_batch(cluster, kind, [ingest.Change("upsert", normalize(kind, obj))])

    put("Node", nvidia.node_object("n1", "H100"))
    for s in nvidia.node_slices("n1", "H100", gpus=2):
        put("ResourceSlice", s)
    for dc in nvidia.device_classes():
        put("DeviceClass", dc)
    foreign = nvidia.pod_object(
        "secret",
        "payroll-trainer",
        [("gpu", nvidia.from_claim("job"))],
        scheduled=_unschedulable(f"0/1 nodes are available: 1 node(s) didn't satisfy {SECRET}."),
    )
    foreign["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "payroll-only-node"}
    put("Pod", foreign)
    put(
        "Pod",
        nvidia.pod_object(
            "research", "trainer", [("gpu", nvidia.from_claim("job"))], scheduled=_unschedulable(AFFINITY)
        ),
    )


def _claim(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": "pasted"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }


def _client(username: str, *namespaces: str) -> Client:
    user = get_user_model().objects.create_user(username, password="x")
    for namespace in namespaces:
        NamespaceGrant.objects.create(user=user, namespace=namespace)
    client = Client()
    client.force_login(user)
    return client


def _form_result(client: Client, claim: dict[str, Any]) -> str:
    response = client.post("/claims/pending/", {"cluster": CLUSTER, "spec": json.dumps(claim)})
    assert response.status_code == 200
    html = unescape(response.content.decode())
    return html[html.index('id="whatif-result"') :]


def _api_result(client: Client, claim: dict[str, Any]) -> dict[str, Any]:
    response = client.post(
        f"/api/v1/whatif?cluster={CLUSTER}", json.dumps(claim), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_a_foreign_claim_name_reveals_neither_its_pods_message_nor_their_existence(fleet) -> None:
    eve = _client("eve", "research")
    existing, missing = _claim("secret", "job"), _claim("secret", "nojob")
    api = _api_result(eve, existing)
    assert SECRET not in json.dumps(api) and "payroll" not in json.dumps(api)
    assert api["category"] == "fits" and not api.get("scheduler_message")
    # The same answer as for a name no pod uses: nothing tells the two apart.
    assert json.dumps(api).replace("secret/job", "secret/nojob") == json.dumps(_api_result(eve, missing))
    html = _form_result(eve, existing)
    assert SECRET not in html and "payroll" not in html
    assert html.replace("secret/job", "secret/nojob") == _form_result(eve, missing)


def test_whoever_may_see_the_namespace_gets_its_pods_scheduling_facts(fleet) -> None:
    # The same paste by a user granted ``secret``: the pod's node selector and message are used.
    api = _api_result(_client("sam", "secret"), _claim("secret", "job"))
    assert api["category"] != "fits"
    assert SECRET in api.get("scheduler_message", "") or "payroll-trainer" in json.dumps(api)


def test_scheduler_text_of_a_visible_pod_reaches_a_restricted_user_intact(fleet) -> None:
    rita = _client("rita", "research")
    api = _api_result(rita, _claim("research", "job"))
    assert api["scheduler_message"] == AFFINITY
    assert AFFINITY in api["summary"]
    assert HIDDEN_REF not in json.dumps(api)
    html = _form_result(rita, _claim("research", "job"))
    assert AFFINITY in html and HIDDEN_REF not in html


VIS = Visibility(False, frozenset({("*", "research")}))


@pytest.mark.parametrize(
    "text",
    [
        RATIO,
        AFFINITY,
        "allocated compute slices 3/7 on gpu.nvidia.com/n1/gpu-0",
        "held by research/job-1 (oldest first)",
    ],
)
def test_text_without_a_foreign_reference_is_left_untouched(text) -> None:
    assert redact_text(text, VIS, CLUSTER) == text


def test_a_foreign_reference_still_disappears_next_to_ratios() -> None:
    text = f"{RATIO} Devices held by secret/job, secret/payroll-7 and research/job-1."
    out = redact_text(text, VIS, CLUSTER)
    assert "secret" not in out and "payroll" not in out
    assert out.startswith(RATIO) and "research/job-1" in out and out.count(HIDDEN_REF) == 2
    result = redact_diagnosis({"summary": text, "scheduler_message": RATIO}, VIS, CLUSTER)
    assert result["scheduler_message"] == RATIO and "secret/" not in result["summary"]
