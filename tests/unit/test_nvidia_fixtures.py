"""The committed fixtures are consistent, up to date, and agree with EXPECTED.json when read independently."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator import nvidia as nv
from tests.fixtures import build_fixtures

FIXTURES = Path(build_fixtures.__file__).resolve().parent


@pytest.fixture(scope="module")
def items() -> list[dict[str, Any]]:
    doc = yaml.safe_load((FIXTURES / "fleet-small.yaml").read_text())
    assert doc["apiVersion"] == "v1"
    assert doc["kind"] == "List"
    return doc["items"]


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return json.loads((FIXTURES / "EXPECTED.json").read_text())


def test_committed_files_match_the_generator(items: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    objs, exp = build_fixtures.build_all()
    assert build_fixtures.as_list(objs)["items"] == items, "re-run tests/fixtures/build_fixtures.py"
    assert exp == expected


def test_every_object_has_uid_resource_version_and_timestamp(items: list[dict[str, Any]]) -> None:
    uids = [o["metadata"]["uid"] for o in items]
    assert len(set(uids)) == len(uids)
    rvs = [int(o["metadata"]["resourceVersion"]) for o in items]
    assert rvs == sorted(rvs)
    assert len(set(rvs)) == len(rvs)
    for o in items:
        assert o["metadata"]["creationTimestamp"].endswith("Z")
        assert isinstance(o["metadata"]["resourceVersion"], str)


def _device_index(items: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for s in items:
        if s["kind"] != "ResourceSlice":
            continue
        for d in s["spec"].get("devices", []):
            key = (s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])
            assert key not in out
            out[key] = d
    return out


def test_allocations_reference_existing_devices_once(items: list[dict[str, Any]]) -> None:
    devices = _device_index(items)
    taken: set[tuple[str, str, str]] = set()
    for c in items:
        if c["kind"] != "ResourceClaim" or "allocation" not in c.get("status", {}):
            continue
        node = c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][
            0
        ]
        requests = {r["name"]: r for r in c["spec"]["devices"]["requests"]}
        for r in c["status"]["allocation"]["devices"]["results"]:
            key = (r["driver"], r["pool"], r["device"])
            assert key in devices, key
            assert r["pool"] == node
            req, _, sub = r["request"].partition("/")
            assert req in requests
            if sub:
                assert sub in [s["name"] for s in requests[req]["firstAvailable"]]
            if not r.get("adminAccess"):
                assert key not in taken, f"double allocation {key}"
                taken.add(key)


def test_pods_and_claims_reference_each_other(items: list[dict[str, Any]]) -> None:
    claims = {
        (c["metadata"]["namespace"], c["metadata"]["name"]): c for c in items if c["kind"] == "ResourceClaim"
    }
    pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in items if p["kind"] == "Pod"}
    for (ns, _), pod in pods.items():
        for st in pod["status"].get("resourceClaimStatuses", []):
            claim = claims[(ns, st["resourceClaimName"])]
            assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    for c in claims.values():
        for ref in c.get("status", {}).get("reservedFor", []):
            pod = pods[(c["metadata"]["namespace"], ref["name"])]
            assert pod["metadata"]["uid"] == ref["uid"]
            assert (
                pod["spec"]["nodeName"]
                == c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
                    "values"
                ][0]
            )


def test_counts_read_back_agree_with_expected(items: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    devices = _device_index(items)
    allocated = {
        (r["driver"], r["pool"], r["device"])
        for c in items
        if c["kind"] == "ResourceClaim"
        for r in c.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        if not r.get("adminAccess")
    }
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    physical: set[tuple[str, str]] = set()
    for key, d in devices.items():
        if key[0] != nv.GPU_DRIVER:
            continue
        attrs = d["attributes"]
        family = nv.model_family(attrs["productName"]["string"])
        kind = attrs["type"]["string"]
        mode = "dynamic" if "consumesCounters" in d else ("static" if kind == "mig" else "")
        row = f"{family}/{kind}" + (f"/{mode}" if mode else "")
        rows[row]["total"] += 1
        rows[row]["allocated"] += key in allocated
        physical.add((family, attrs["parentUUID"]["string"] if kind == "mig" else attrs["uuid"]["string"]))
    for row, counts in rows.items():
        assert expected["devices"][row]["total"] == counts["total"], row
        assert expected["devices"][row]["allocated"] == counts["allocated"], row
    assert set(rows) == set(expected["devices"])
    assert dict(Counter(f for f, _ in physical)) == expected["physical_gpus"]
    assert sum(1 for o in items if o["kind"] == "Node") == expected["nodes"]
    assert sum(1 for o in items if o["kind"] == "ResourceSlice") == expected["resource_slices"]

    states: Counter[str] = Counter()
    for c in items:
        if c["kind"] != "ResourceClaim":
            continue
        status = c.get("status", {})
        if "allocation" not in status:
            states["pending"] += 1
        elif status.get("reservedFor"):
            states["allocated_reserved"] += 1
        else:
            states["allocated_unreserved"] += 1
    assert {"total": sum(states.values()), **states} == expected["claims"]


def test_pending_pods_carry_the_scheduler_messages(items: list[dict[str, Any]]) -> None:
    pending = [p for p in items if p["kind"] == "Pod" and p["status"]["phase"] == "Pending"]
    reasons = Counter(c["reason"] for p in pending for c in p["status"].get("conditions", []))
    assert reasons == {"Unschedulable": 2, "SchedulerError": 1}
    messages = {c["message"] for p in pending for c in p["status"].get("conditions", [])}
    assert build_fixtures.UNSCHEDULABLE_MSG in messages
    assert any("CEL runtime error" in m and m.startswith('running "DynamicResources"') for m in messages)
    events = Counter(e["reason"] for e in items if e["kind"] == "Event")
    assert events == {"FailedScheduling": 3, "FailedResourceClaimCreation": 1}


def test_fixture_size_is_moderate() -> None:
    assert sum(p.stat().st_size for p in FIXTURES.glob("*.yaml")) < 2_000_000
