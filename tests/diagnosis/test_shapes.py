"""Claims of one shape share one diagnosis (``claims.tasks.Shapes``), and each gets exactly what it would get
diagnosed alone: its own claim's and pod's names, its pod's node selector and scheduler message."""

from __future__ import annotations

import json
from typing import Any

from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from claims.tasks import SHAPE_POD, Shapes
from fleet.models import ResourceClaim
from simulator import nvidia
from tests.diagnosis.fleet import GPU, held, node, state

Obj = dict[str, Any]
DRA = "0/2 nodes are available: 2 cannot allocate all claims."
SPREAD = "0/2 nodes are available: 2 node(s) didn't match pod topology spread constraints."


def made_from_template(pod: str) -> Obj:
    """A claim as the resource-claim controller makes it for ``pod``: owner, annotation, generateName."""
    claim = nvidia.claim_object(
        "team",
        f"{pod}-gpu-x7k2p",
        [
            nvidia.exactly_request(
                "gpu", "gpu.nvidia.com", 1, selectors=[f"{GPU}.productName.contains('H100')"]
            )
        ],
        owner_pod={"metadata": {"name": pod, "uid": f"uid-{pod}"}},
        pod_claim_name="gpu",
        labels={"job": pod},
    )
    return {**claim, "kind": "ResourceClaim"}


def pod_of(claim: Obj, on: str | None = None, message: str | None = None) -> Obj:
    name = claim["metadata"]["ownerReferences"][0]["name"]
    pod = nvidia.pod_object(
        "team",
        name,
        [("gpu", nvidia.from_claim(claim["metadata"]["name"]))],
        scheduled=nvidia.unschedulable_condition(message, "2026-01-01T00:00:00Z") if message else None,
        labels={"job": name},
    )
    if on:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": on}
    return {**pod, "kind": "Pod"}


def fleet(*objs: Obj) -> FleetState:
    # h1's eight H100 are all held: a claim for an H100 pends on h1 and fits on h2.
    holders = held("busy", "h1", [f"gpu-{i}" for i in range(8)], "2026-01-01T00:00:00Z")
    return state(node("h1", "H100"), node("h2", "H100"), {**holders, "kind": "ResourceClaim"}, list(objs))


def shared(fleet_state: FleetState, claims: list[Obj]) -> tuple[list[Obj], int]:
    """Each claim's diagnosis through one Shapes, and how many diagnoses that took."""
    shapes = Shapes(fleet_state)
    out = [json.loads(shapes.text_of(ResourceClaim(raw=c))) for c in claims]
    return out, shapes.diagnosed


def alone(claims: list[Obj], objs: list[Obj]) -> list[Obj]:
    """Each claim diagnosed by itself on a state of its own (nothing cached on a state is shared)."""
    return [json.loads(json.dumps(diagnose(fleet(*objs), c).as_dict())) for c in claims]


def test_template_made_claims_whose_pods_are_alike_share_one_diagnosis_each_naming_its_own() -> None:
    claims = [made_from_template(f"train-{i}") for i in range(3)]
    objs = [*claims, *(pod_of(c, message=DRA) for c in claims)]
    results, diagnosed = shared(fleet(*objs), claims)
    assert diagnosed == 1
    assert results == alone(claims, objs)
    for i, result in enumerate(results):
        assert result["claim"] == f"team/train-{i}-gpu-x7k2p"
        assert result["pod"] == f"team/train-{i}"
        assert result["category"] == "fits"  # on h2


def test_pods_with_other_node_selectors_or_scheduler_messages_get_diagnoses_of_their_own() -> None:
    claims = [made_from_template(f"train-{i}") for i in range(5)]
    pods = [
        pod_of(claims[0], message=DRA),
        pod_of(claims[1], message=DRA),
        pod_of(claims[2], on="h1", message=DRA),  # only on h1, where every H100 is held
        pod_of(claims[3], message=SPREAD),  # pending for a reason that is not DRA's
        pod_of(claims[4]),  # no message yet
    ]
    objs = [*claims, *pods]
    results, diagnosed = shared(fleet(*objs), claims)
    assert diagnosed == 4
    assert results == alone(claims, objs)
    assert results[2]["category"] != "fits"
    assert SPREAD in results[3]["summary"] and SPREAD not in results[0]["summary"]


def test_a_claim_named_like_the_placeholder_is_diagnosed_alone_and_right() -> None:
    claims = [made_from_template(SHAPE_POD), made_from_template("train-1")]
    objs = [*claims, *(pod_of(c, message=DRA) for c in claims)]
    results, diagnosed = shared(fleet(*objs), claims)
    assert diagnosed == 2
    assert results == alone(claims, objs)
    assert results[0]["pod"] == f"team/{SHAPE_POD}"


def test_pods_whose_node_selectors_cut_one_device_group_alike_each_get_their_own_nodes_counted() -> None:
    # Five H100 nodes: one signature group (40 uuids make the uuid high-cardinality). Rack "a" is h1, h3,
    # h4 and rack "b" is h1, h2, h4: each pod's nodes hold 24 of the group's devices, the first on h1 and
    # the last on h4. Only h2 has free devices, so only the rack-b pod fits.
    racks = {"h1": "ab", "h2": "b", "h3": "a", "h4": "ab", "h5": ""}
    parts: list[list[Obj] | Obj] = []
    for name, rack in racks.items():
        objs = node(name, "H100")
        objs[0]["metadata"]["labels"].update({f"rack-{r}": "yes" for r in rack})
        parts.append(objs)
        if name != "h2":
            busy = held(f"busy-{name}", name, [f"gpu-{i}" for i in range(8)], "2026-01-01T00:00:00Z")
            parts.append({**busy, "kind": "ResourceClaim"})
    claims = [made_from_template("train-a"), made_from_template("train-b")]
    pods = [pod_of(c, message=DRA) for c in claims]
    for pod, rack in zip(pods, "ab", strict=True):
        pod["spec"]["nodeSelector"] = {f"rack-{rack}": "yes"}
    for order in (claims, claims[::-1]):  # whichever is diagnosed first on the shared state
        fleet_state = state(*parts, *order, *pods)
        results, diagnosed = shared(fleet_state, order)
        assert diagnosed == 2
        by_name = {r["claim"]: r for r in results}
        a, b = by_name["team/train-a-gpu-x7k2p"], by_name["team/train-b-gpu-x7k2p"]
        assert a["category"] == "capacity" and a["requests"][0]["free"] == 0
        assert b["category"] == "fits" and "node h2" in b["summary"]
        for claim, result in ((claims[0], a), (claims[1], b)):  # each alone, on a state of its own
            assert result == json.loads(json.dumps(diagnose(state(*parts, *claims, *pods), claim).as_dict()))
