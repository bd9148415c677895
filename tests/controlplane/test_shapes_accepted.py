"""Everything we fabricate is accepted by the real API server's validation.

Objects are created with ``dryRun=All`` (full server-side validation and admission, nothing persisted).
Status is ignored on create, so claims and pods that carry one are created for real and their status
is then checked with a dry-run status update.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator import scenarios
from simulator.scheduling_allocator import allocator_schedule
from simulator.spec import build_fleet, preset
from tests.controlplane.kube import ApiError, Kube, wait_for

pytestmark = pytest.mark.controlplane

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STATUS_CHECKED = ("ResourceClaim", "Pod")
Obj = dict[str, Any]


def _for_create(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "deletionTimestamp"):
        meta.pop(key, None)
    return out


def _namespaces(objs: Iterable[Obj]) -> set[str]:
    return {o["metadata"]["namespace"] for o in objs if o.get("metadata", {}).get("namespace")}


def _ensure_namespaces(kube: Kube, names: set[str]) -> None:
    for ns in sorted(names):
        try:
            kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        except ApiError as err:
            if err.code != 409:
                raise
        # The ServiceAccount admission plugin rejects pods until the controller has created it.
        wait_for(
            f"{ns}/default ServiceAccount", partial(kube.get, "ServiceAccount", "default", ns), timeout=30
        )


def _rejections(kube: Kube, objs: Iterable[Obj]) -> Iterator[str]:
    """Every object the server refuses, with its message (empty when all are accepted)."""
    for obj in objs:
        kind, meta = obj["kind"], obj["metadata"]
        ns = meta.get("namespace", "")
        body = _for_create(obj)
        try:
            kube.request("POST", kube.path(kind, namespace=ns), body, query={"dryRun": "All"})
            if kind in STATUS_CHECKED and obj.get("status"):
                yield from _status_rejections(kube, kind, ns, body)
        except ApiError as err:
            yield f"{kind} {ns}/{meta['name']}: {err.code} {err.status.get('message', '')}"


def _status_rejections(kube: Kube, kind: str, ns: str, body: Obj) -> Iterator[str]:
    real = copy.deepcopy(body)
    # An owner that does not exist here would let the garbage collector race the status check.
    real["metadata"].pop("ownerReferences", None)
    real["metadata"]["name"] = real["metadata"]["name"][:50] + "-st"
    if kind == "Pod":
        real["spec"].pop("nodeName", None)  # no kubelet: keep the scheduler's hands off it
        real["spec"]["schedulerName"] = "nobody"
    created = kube.create(real, ns)
    try:
        update = copy.deepcopy(created)
        update["status"] = body["status"]
        path = kube.path(kind, created["metadata"]["name"], ns, "status")
        kube.request("PUT", path, update, query={"dryRun": "All"})
    except ApiError as err:
        yield f"{kind} {ns}/{body['metadata']['name']} status: {err.code} {err.status.get('message', '')}"
    finally:
        kube.request(
            "DELETE", kube.path(kind, created["metadata"]["name"], ns), query={"gracePeriodSeconds": "0"}
        )


def _fixture_objects() -> list[Obj]:
    docs = yaml.safe_load_all((FIXTURES / "fleet-small.yaml").read_text())
    return [item for doc in docs if doc for item in doc.get("items", [doc])]


def test_every_fixture_object_is_accepted_by_the_api_server(kube: Kube) -> None:
    objs = _fixture_objects()
    assert len(objs) > 50
    for ns in (o for o in objs if o["kind"] == "Namespace"):
        try:
            kube.create(_for_create(ns))
        except ApiError as err:
            if err.code != 409:
                raise
    objs = [o for o in objs if o["kind"] != "Namespace"]
    _ensure_namespaces(kube, _namespaces(objs))
    assert list(_rejections(kube, objs)) == []


@pytest.mark.parametrize("name", ["small", "medium"])
def test_every_object_of_a_preset_fleet_is_accepted(kube: Kube, name: str) -> None:
    fleet = build_fleet(preset(name))
    assert list(_rejections(kube, fleet.objects())) == []


def test_every_object_of_the_large_preset_is_accepted(kube: Kube) -> None:
    # 5,000 nodes and 9,200 slices: dry runs in a few threads (each request is independent).
    fleet = build_fleet(preset("L"))
    objs = list(fleet.objects())
    assert len(objs) > 14_000
    with ThreadPoolExecutor(max_workers=4) as pool:
        chunks = [objs[i::4] for i in range(4)]
        rejected = [
            r for found in pool.map(lambda part: list(_rejections(kube, part)), chunks) for r in found
        ]
    assert rejected == []


def test_every_object_of_the_monday_scenario_is_accepted(kube: Kube) -> None:
    scenario = scenarios.monday(schedule=allocator_schedule)
    objs = [
        o
        for kind in ("ResourceClaimTemplate", "ResourceClaim", "Pod", "Event")
        for o in scenario.cluster.objects(kind)
    ]
    assert any(o.get("status", {}).get("allocation") for o in objs if o["kind"] == "ResourceClaim")
    _ensure_namespaces(kube, _namespaces(objs))
    assert list(_rejections(kube, objs)) == []
