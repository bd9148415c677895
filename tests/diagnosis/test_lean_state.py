"""The recompute task's lean fleet (issue 11): what it keeps, and that it diagnoses like the full one."""

from __future__ import annotations

import copy
import gc
import json
import os
import sys
import weakref
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import call_command
from django.db import connection

from claims import fleetstate, tasks
from claims.diagnosis import diagnose, diagnose_name
from claims.fleetstate import FleetState, decode_json, lean_object, share_values, shared_more_than_once
from claims.keyshared import keyshared
from claims.livestate import LiveFleet
from fleet.models import ResourceClaim, ResourceSlice

FLEET = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml"


@pytest.fixture
def imported(db: None) -> None:
    if connection.vendor != "postgresql":
        pytest.fail(f"database tests need PostgreSQL, got {connection.vendor}")
    call_command("import_snapshot", str(FLEET), cluster="fixtures", stdout=StringIO())


def test_a_lean_state_diagnoses_every_claim_like_the_full_one(imported: None) -> None:
    full, lean = FleetState.from_db("fixtures"), FleetState.from_db("fixtures", lean=True)
    claims = list(ResourceClaim.objects.filter(cluster__name="fixtures").order_by("name"))
    assert any(c.state == "pending" for c in claims) and any(c.state != "pending" for c in claims)
    for claim in claims:  # as the task does: the claim from its own row
        raw = {**claim.raw, "kind": "ResourceClaim"}
        assert diagnose(lean, raw).as_dict() == diagnose(full, raw).as_dict(), claim.name


def test_a_lean_state_drops_what_the_diagnosis_never_reads(imported: None) -> None:
    lean = FleetState.from_db("fixtures", lean=True)
    pod = lean.objects["Pod"][0]
    assert set(pod) <= {"kind", "metadata", "spec", "status"}
    # containers only for their DRA extended resource requests
    assert all(set(c) <= {"name", "resources", "restartPolicy"} for c in pod["spec"]["containers"])
    allocated = [c for c in lean.objects["ResourceClaim"] if (c.get("status") or {}).get("allocation")]
    assert allocated and all("spec" not in c and "ownerReferences" not in c["metadata"] for c in allocated)
    pending = [c for c in lean.objects["ResourceClaim"] if not (c.get("status") or {}).get("allocation")]
    full = FleetState.from_db("fixtures")
    assert pending == [
        c for c in full.objects["ResourceClaim"] if not (c.get("status") or {}).get("allocation")
    ]


def test_equal_device_values_are_shared_but_not_across_types() -> None:
    shared: dict[Any, Any] = {}
    a = share_values({"productName": {"string": "NVIDIA B200"}, "n": {"int": 1}}, shared)
    b = share_values({"productName": {"string": "NVIDIA B200"}, "n": {"int": True}}, shared)
    assert a["productName"] is b["productName"]
    assert b["n"] == {"int": True} and b["n"]["int"] is True  # 1 == True, but not the same value
    assert share_values({"x": {"value": 1.0}}, shared)["x"]["value"].__class__ is float


def test_equal_containers_are_shared_whole_and_unequal_ones_kept_apart() -> None:
    shared: dict[Any, Any] = {}

    def partition(parent: str, memory_slice: str) -> dict[str, Any]:
        return {
            "attributes": {"profile": {"string": "1g.10gb"}, "parentUUID": {"string": parent}},
            "capacity": {"memory": {"value": "9984Mi"}},
            "consumesCounters": [
                {
                    "counterSet": "gpu-0-counter-set",
                    "counters": {memory_slice: {"value": "1"}, "m": {"value": 1}},
                }
            ],
        }

    a, b, c = (
        {part: share_values(v, shared) for part, v in partition(p, s).items()}
        for p, s in (("GPU-a", "memory-slice-2"), ("GPU-a", "memory-slice-2"), ("GPU-b", "memory-slice-3"))
    )
    # The same partition of one GPU, seen twice: one copy of each part.
    assert all(a[part] is b[part] for part in a)
    # Another GPU, another placement: only what is equal is shared, and nothing changed value.
    assert c["capacity"] is a["capacity"]
    assert c["attributes"] is not a["attributes"] and c["attributes"]["profile"] is a["attributes"]["profile"]
    assert c["consumesCounters"] is not a["consumesCounters"]
    assert c == partition("GPU-b", "memory-slice-3") and a == partition("GPU-a", "memory-slice-2")
    # 1 and "1" and 1.0 and True stay apart, inside containers too.
    values = [share_values({"x": [{"v": v}]}, shared) for v in (1, "1", 1.0, True)]
    assert [type(v["x"][0]["v"]) for v in values] == [int, str, float, bool]
    assert len({id(v) for v in values}) == 4


def test_lean_slices_keep_their_devices_and_share_equal_values() -> None:
    shared: dict[Any, Any] = {}
    device = {
        "name": "gpu-0",
        "capacity": {"memory": {"value": "80Gi"}},
        "attributes": {"t": {"string": "gpu"}},
    }
    slices = [
        lean_object(
            {
                "kind": "ResourceSlice",
                "metadata": {"name": f"s{i}", "labels": {"a": "b"}},
                "spec": {"devices": [{**device}]},
            },
            shared,
        )
        for i in range(2)
    ]
    assert [s["spec"]["devices"] for s in slices] == [[device], [device]]
    assert (
        slices[0]["spec"]["devices"][0]["capacity"]["memory"]
        is slices[1]["spec"]["devices"][0]["capacity"]["memory"]
    )
    assert slices[0]["metadata"] == {"name": "s0"}


def test_lean_slices_share_a_models_counter_sets_and_the_context_counts_each_pool_alike() -> None:
    # Every node of a dynamic-MIG model publishes the same counter sets (8 GPUs x 15 counters); lean
    # slices hold one list, and what is left of a counter is still each pool's own.
    from claims.diagnosis.groups import Context

    sets = [{"name": f"gpu-{g}-counter-set", "counters": {"memory": {"value": "80Gi"}}} for g in range(2)]
    mig = {
        "name": "gpu-0-mig-0",
        "attributes": {"profile": {"string": "1g.10gb"}},
        "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "10Gi"}}}],
    }

    def node(n: str) -> list[Any]:
        spec = {
            "driver": "gpu.nvidia.com",
            "nodeName": n,
            "pool": {"name": n, "generation": 1, "resourceSliceCount": 2},
        }
        return [
            {
                "kind": "ResourceSlice",
                "metadata": {"name": f"{n}-counters"},
                "spec": {**spec, "sharedCounters": sets},
            },
            {
                "kind": "ResourceSlice",
                "metadata": {"name": f"{n}-devices"},
                "spec": {**spec, "devices": [mig]},
            },
        ]

    shared: dict[Any, Any] = {}
    slices = [lean_object(json.loads(json.dumps(s)), shared) for n in ("n1", "n2") for s in node(n)]
    assert slices[0]["spec"]["sharedCounters"] == sets
    assert slices[0]["spec"]["sharedCounters"] is slices[2]["spec"]["sharedCounters"]
    held = {
        "kind": "ResourceClaim",
        "metadata": {"name": "held", "namespace": "ns", "uid": "u1"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0-mig-0"}
                    ]
                }
            }
        },
    }
    state = FleetState.from_lists({"ResourceSlice": slices, "ResourceClaim": [held]})
    left = Context.of(state).counter_left
    gib = 2**30
    assert left.get(("gpu.nvidia.com", "n1", "gpu-0-counter-set", "memory")) == 70 * gib
    assert left.get(("gpu.nvidia.com", "n2", "gpu-0-counter-set", "memory")) == 80 * gib
    assert left.get(("gpu.nvidia.com", "n1", "gpu-1-counter-set", "memory")) == 80 * gib
    assert left.get(("gpu.nvidia.com", "n1", "no-such-set", "memory")) == 0


def test_lean_pods_and_claims_share_what_their_workload_repeats() -> None:
    shared: dict[Any, Any] = {}

    def pod(i: int) -> dict[str, Any]:
        return {
            "kind": "Pod",
            "metadata": {"name": f"job-{i}", "namespace": "ml", "uid": f"u{i}", "labels": {"a": "b"}},
            "spec": {
                "nodeName": "node-1",
                "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            },
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Initialized", "status": "True"},
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ],
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"c{i}"}],
            },
        }

    device_status = {
        "driver": "gpu.nvidia.com",
        "pool": "node-1",
        "device": "gpu-0",
        "conditions": [{"type": "Ready", "status": "True"}],
    }

    def claim(i: int) -> dict[str, Any]:
        result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": f"gpu-{i}"}
        return {
            "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": "ml", "uid": f"cu{i}"},
            "spec": {"devices": {"requests": [{"name": "gpu"}]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [result],
                        "config": [{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com"}}],
                    }
                },
                "devices": [{**device_status, "data": {"deep": {"er": [{"x": 1}]}}, "networkData": {}}],
            },
        }

    # Decoded from JSON, as stored objects are: equal strings are separate objects until made one.
    pods = [lean_object(orjson.loads(orjson.dumps(pod(i))), shared) for i in range(2)]
    claims = [lean_object(orjson.loads(orjson.dumps(claim(i))), shared) for i in range(2)]
    a, b = pods
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["spec"]["resourceClaims"] is b["spec"]["resourceClaims"]
    assert a["spec"]["nodeName"] is b["spec"]["nodeName"] and a["status"]["phase"] is b["status"]["phase"]
    assert a["status"]["resourceClaimStatuses"] != b["status"]["resourceClaimStatuses"]
    assert a["spec"]["containers"] == [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}]
    assert a["metadata"] == {"name": "job-0", "namespace": "ml", "uid": "u0"}
    # Of the conditions, the scheduler's (its message); of the allocation, the results, not the config.
    assert a["status"]["conditions"] == [{"type": "PodScheduled", "status": "True"}]
    assert all(set(c["status"]["allocation"]["devices"]) == {"results"} for c in claims)
    # Of the devices' status, what binding conditions match and read; not the driver's data.
    assert all(c["status"]["devices"] == [device_status] for c in claims)
    first, second = (c["status"]["allocation"]["devices"]["results"][0] for c in claims)
    assert first["pool"] is second["pool"] and first["driver"] is second["driver"]
    assert first == {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}
    # Device names repeat on every node of a model: one string.
    slices = [
        lean_object(
            orjson.loads(orjson.dumps({"kind": "ResourceSlice", "spec": {"devices": [{"name": "gpu-0"}]}})),
            shared,
        )
        for _ in range(2)
    ]
    assert slices[0]["spec"]["devices"][0]["name"] is slices[1]["spec"]["devices"][0]["name"]


def test_a_lean_pod_says_what_the_scheduler_said_among_its_other_conditions() -> None:
    from claims.diagnosis.placement import scheduled_message

    pod = {
        "kind": "Pod",
        "metadata": {"name": "job-0", "namespace": "ml"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "False"},
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "message": "0/5 nodes: cannot allocate all claims",
                },
                {"type": "Initialized", "status": "True"},
            ],
        },
    }
    lean = lean_object(orjson.loads(orjson.dumps(pod)), {})
    assert scheduled_message(lean) == scheduled_message(pod) == "0/5 nodes: cannot allocate all claims"
    assert [c["type"] for c in lean["status"]["conditions"]] == ["PodScheduled"]


def test_only_values_held_twice_stay_shared_for_the_changes_to_come(imported: None) -> None:
    shared: dict[Any, Any] = {}
    a = share_values([{"x": {"string": "same"}}, {"y": {"string": "once"}}], shared)
    b = share_values([{"x": {"string": "same"}}], shared)
    kept = shared_more_than_once(shared)
    # {"x": ...} is in both lists, and {"string": "same"} is a part of it; everything else (the lists,
    # {"y": ...} and its part) has one holder.
    assert list(kept.values()) == [{"string": "same"}, {"x": {"string": "same"}}]
    assert len(shared) == 6
    # An equal value met later (a changed slice) is the kept one, found through its part's entry.
    assert share_values({"x": {"string": "same"}}, kept) is a[0] is b[0]
    assert share_values({"y": {"string": "once"}}, kept) is not a[1]
    live = LiveFleet.load("fixtures")
    assert live.shared and shared_more_than_once(live.shared).keys() == live.shared.keys()
    everything: dict[Any, Any] = {}
    for table in live.objects.values():
        for obj in table.values():
            share_values(obj, everything)
    assert len(live.shared) < len(everything)


def test_changed_slices_keep_only_their_values_held_twice_as_a_load_does(imported: None) -> None:
    # An update reads its changed slices back through the fleet's shared values. The values they alone
    # hold (a republished slice's UUIDs and serials) must not stay as entries: under churn they would
    # grow the worker until the next full recompute.
    live = LiveFleet.load("fixtures")
    kept = dict(live.shared)
    names = sorted(name for _, name in live.objects["ResourceSlice"])
    assert len(names) > 1
    before = dict(live.objects["ResourceSlice"])
    live.apply([(1, {"kind": "ResourceSlice", "written": names})])  # every slice read back, unchanged
    after = live.objects["ResourceSlice"]
    assert after == before and all(after[k] is not before[k] for k in before)  # fresh objects
    assert live.shared.keys() == kept.keys()
    # ... and they hold the kept values, not copies: a value two devices share is one object again.
    held = {id(v) for v in kept.values()}
    assert any(
        id(device.get("attributes")) in held or id(device.get("capacity")) in held
        for obj in after.values()
        for device in obj["spec"].get("devices") or []
    )
    # A value new to the fleet that two changed devices hold stays shared for the changes to come.
    row = ResourceSlice.objects.get(cluster__name="fixtures", name=names[0])
    raw = row.raw
    devices = raw["spec"]["devices"]
    assert len(devices) > 1
    for device in devices[:2]:
        device["attributes"] = {**device.get("attributes", {}), "rack": {"string": "new-rack-7"}}
    row.raw = raw
    row.save(update_fields=["raw"])
    live.apply([(2, {"kind": "ResourceSlice", "written": [names[0]]})])
    new_keys = live.shared.keys() - kept.keys()
    assert ("string", str, "new-rack-7") in new_keys
    first, second = live.objects["ResourceSlice"][("", names[0])]["spec"]["devices"][:2]
    assert first["attributes"]["rack"] is second["attributes"]["rack"]


def test_a_relist_read_whole_keeps_only_values_held_twice(imported: None) -> None:
    live = LiveFleet.load("fixtures")
    kept = set(live.shared)
    live.apply([(1, {"kind": "ResourceSlice", "resync": True})])  # a relist too large to name its keys
    assert live.shared.keys() == kept


def test_both_ways_of_sharing_a_dict_find_the_same_copies() -> None:
    # _share_named (a device's attributes and capacity) and share_values (everything else) key a value
    # alike: an equal value met through either is the one object already held.
    attributes = {"productName": {"string": "NVIDIA H100"}, "memory": {"value": "80Gi"}, "n": {"int": 7}}
    shared: dict[Any, Any] = {}
    named = fleetstate._share_named(copy.deepcopy(attributes), shared)
    general = share_values(copy.deepcopy(attributes), shared)
    assert named == general == attributes and named is general
    assert all(named[k] is general[k] for k in attributes)
    other: dict[Any, Any] = {}
    leaf = share_values({"value": "80Gi"}, other)
    assert fleetstate._share_named({"memory": {"value": "80Gi"}}, other)["memory"] is leaf
    # A plain copy, not a key-shared one: the leaf may be a free-form map, whose keys must not make layouts.
    assert sys.getsizeof(leaf) == sys.getsizeof({"value": "80Gi"}) != sys.getsizeof(keyshared({"value": "1"}))
    nested = {"counters": {"memory": {"value": "1"}}, "name": {"string": "x"}}
    assert fleetstate._share_named(copy.deepcopy(nested), other) is share_values(copy.deepcopy(nested), other)


def test_events_a_whole_read_of_their_kind_already_saw_are_not_applied_again(
    imported: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The load takes the log's number before reading each kind: what was logged up to it is in what it
    # read, and reading the kind whole again for such an event would read it twice.
    from claims import livestate

    marks = iter(range(10, 10 + len(livestate.READ)))  # the slices read after event 10, classes 11, ...
    live = LiveFleet.load("fixtures", mark=lambda: next(marks))
    at = {kind: 10 + i for i, kind in enumerate(livestate.READ)}
    assert live.read_at == at
    reads: list[str] = []
    original = livestate._stored

    def spy(kind: str, rows: Any, shared: Any, *rest: Any) -> list[dict[str, Any]]:
        reads.append(kind)
        return original(kind, rows, shared, *rest)

    monkeypatch.setattr(livestate, "_stored", spy)
    slices = dict(live.objects["ResourceSlice"])
    first = sorted(name for _, name in slices)[0]
    claims_at = at["ResourceClaim"]
    seen: list[tuple[int, dict[str, Any]]] = [
        (9, {"kind": "ResourceSlice", "written": [first]}),
        (10, {"kind": "ResourceSlice", "resync": True}),
        (claims_at, {"kind": "ResourceClaim", "resync": True}),
        (10, {"kind": "", "imported": True}),  # in what every kind's read saw
    ]
    assert not live.apply(seen) and reads == []
    assert all(live.objects["ResourceSlice"][k] is v for k, v in slices.items())
    # Logged after the slices were read: read again, once for both relists of one batch, and the keys
    # written after them are in that read too.
    later: list[tuple[int, dict[str, Any]]] = [
        (11, {"kind": "ResourceSlice", "resync": True}),
        (claims_at, {"kind": "ResourceSlice", "resync": True}),
        (claims_at + 1, {"kind": "ResourceSlice", "written": [first]}),
    ]
    reach = live.apply(later)
    assert reach.everything and reads == ["ResourceSlice"]
    assert live.read_at["ResourceSlice"] == claims_at + 1
    assert (
        live.objects["ResourceSlice"] == slices
        and live.objects["ResourceSlice"][("", first)] is not slices[("", first)]
    )
    # A claims relist logged after the claims were read is read; an import logged after the classes were
    # read (11) reads every kind, though the others were read after it.
    reads.clear()
    assert live.apply([(claims_at + 1, {"kind": "ResourceClaim", "resync": True})]).everything
    assert reads == ["ResourceClaim"]
    reads.clear()
    assert not live.apply([(11, {"kind": "", "imported": True})]) and reads == []
    assert live.apply([(12, {"kind": "", "imported": True})]).everything
    assert reads == list(livestate.READ)


def test_the_context_reads_the_counters_of_a_pools_newest_generation_only() -> None:
    # While a driver republishes a pool, the older generation's slices stay until it deletes them; the
    # allocator (GatherPools) reads the newest generation alone, and so must what is left of a counter.
    from claims.diagnosis.groups import Context

    def counters(generation: int, name: str, memory: str) -> Any:
        return {
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": generation, "resourceSliceCount": 2},
                "sharedCounters": [{"name": "cs", "counters": {"memory": {"value": memory}}}],
            },
        }

    mig = {
        "name": "gpu-0-mig-0",
        "consumesCounters": [{"counterSet": "cs", "counters": {"memory": {"value": "10Gi"}}}],
    }
    devices = {
        "kind": "ResourceSlice",
        "metadata": {"name": "n1-devices"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 2, "resourceSliceCount": 2},
            "devices": [mig],
        },
    }
    # The stale slice comes last in name order, where "later slices win" would pick it.
    slices = [counters(2, "n1-counters", "80Gi"), devices, counters(1, "n1-old-counters", "20Gi")]
    left = Context.of(FleetState.from_lists({"ResourceSlice": slices})).counter_left
    assert left.get(("gpu.nvidia.com", "n1", "cs", "memory")) == 80 * 2**30


def test_explain_loads_the_fleet_lean_with_what_it_explains_whole(
    imported: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A whole XL fleet is ~10 GB: explain NAMESPACE/NAME loads it lean, keeping the claim or pod it is
    # asked about (and that pod's claims) whole, and says what the whole fleet says.
    full = FleetState.from_db("fixtures")
    calls: list[dict[str, Any]] = []
    original = FleetState.from_db.__func__  # type: ignore[attr-defined]

    def spy(cls: type[FleetState], *args: Any, **kwargs: Any) -> FleetState:
        calls.append(kwargs)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(FleetState, "from_db", classmethod(spy))
    targets = [
        *((c["metadata"]["namespace"], c["metadata"]["name"]) for c in full.objects["ResourceClaim"]),
        *((p["metadata"]["namespace"], p["metadata"]["name"]) for p in full.objects["Pod"]),
    ]
    allocated = [c for c in full.objects["ResourceClaim"] if (c.get("status") or {}).get("allocation")]
    assert allocated and full.objects["Pod"]
    for namespace, name in targets:
        out = StringIO()
        call_command("explain", f"{namespace}/{name}", "--cluster", "fixtures", "--json", stdout=out)
        expected = diagnose_name(full, namespace, name).as_dict()
        assert json.loads(out.getvalue()) == json.loads(json.dumps(expected, default=str)), name
        assert calls.pop() == {"lean": True, "target": (namespace, name)}
    meta = allocated[0]["metadata"]
    lean = original(FleetState, "fixtures", lean=True, target=(meta["namespace"], meta["name"]))
    assert lean.find("ResourceClaim", meta["namespace"], meta["name"]) == allocated[0]
    others = [c for c in lean.objects["ResourceClaim"] if (c.get("status") or {}).get("allocation")]
    assert len(others) == len(allocated) and sum("spec" in c for c in others) == 1
    # A pod is kept whole with the claims it names (allocated ones too), every other pod and allocated
    # claim lean.
    whole_claims, spec_only = 0, False
    for pod in full.objects["Pod"]:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        lean = original(FleetState, "fixtures", lean=True, target=(namespace, name))
        assert lean.find("Pod", namespace, name) == pod
        # A claim made from a template is named in the pod's status, a claim made beforehand in its spec.
        refs = [
            *((pod.get("status") or {}).get("resourceClaimStatuses") or []),
            *(pod["spec"].get("resourceClaims") or []),
        ]
        named = {str(r["resourceClaimName"]) for r in refs if r.get("resourceClaimName")}
        # Pending claims are loaded whole anyway: an allocated one named in the spec is the case at stake.
        spec_only = spec_only or any(
            (full.find("ResourceClaim", namespace, str(r["resourceClaimName"])) or {})
            .get("status", {})
            .get("allocation")
            for r in pod["spec"].get("resourceClaims") or []
            if r.get("resourceClaimName")
        )
        for claim in named:
            assert lean.find("ResourceClaim", namespace, claim) == full.find(
                "ResourceClaim", namespace, claim
            )
        whole_claims += sum(
            bool((c.get("status") or {}).get("allocation")) and "spec" in c
            for c in lean.objects["ResourceClaim"]
        )
        assert (
            sum(
                p != full.find("Pod", p["metadata"]["namespace"], p["metadata"]["name"])
                for p in lean.objects["Pod"]
            )
            == len(full.objects["Pod"]) - 1
        )
    assert whole_claims > 0 and spec_only


def test_a_lean_v1beta1_slice_keeps_its_devices_attributes(db: None, tmp_path: Path) -> None:
    # Rows keep what the cluster served: an older cluster's slices are v1beta1 (devices in ``basic``).
    snapshot = tmp_path / "beta.json"
    slice_ = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "n1",
            "devices": [
                {"name": "gpu-0", "basic": {"attributes": {"productName": {"string": "NVIDIA B200"}}}}
            ],
        },
    }
    snapshot.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": [slice_]}))
    call_command("import_snapshot", str(snapshot), cluster="beta", stdout=StringIO())
    full, lean = FleetState.from_db("beta"), FleetState.from_db("beta", lean=True)
    assert [d.model for d in lean.devices()] == [d.model for d in full.devices()] == ["B200"]


def test_stored_json_decodes_like_json_loads_even_beyond_64_bits() -> None:
    assert decode_json('{"a": [1, 2.5, true, null]}') == {"a": [1, 2.5, True, None]}
    assert decode_json('{"big": 123456789012345678901234567890}') == {"big": 123456789012345678901234567890}
    assert decode_json('{"n": -9223372036854775809}') == {"n": -9223372036854775809}
    assert decode_json('{"x": 1e400}') == {"x": float("inf")}
    assert decode_json('{"s": "a\\ud800b"}') == {"s": "a\ud800b"}  # a lone surrogate, escaped
    assert decode_json('["a\ud800"]') == ["a\ud800"]  # one unescaped: not UTF-8, so json decodes it
    assert decode_json('{"s": "\u0661\u0662"}') == {"s": "\u0661\u0662"}  # non-ASCII digits: a string
    assert decode_json(None) is None


def test_only_a_run_of_19_ascii_digits_sends_the_text_to_json(monkeypatch: pytest.MonkeyPatch) -> None:
    # orjson turns an integer beyond 64 bits into a float: such a text must be decoded by json, and
    # nothing else should (orjson is several times faster).
    by_json: list[str] = []
    original = fleetstate.json.loads

    def spy(text: str) -> Any:
        by_json.append(text)
        return original(text)

    monkeypatch.setattr(fleetstate.json, "loads", spy)
    for text in ("[123456789012345678, 1234567890.123456789]", '["\u0661\u0662\u0663"]', '{"a": "x1"}'):
        assert decode_json(text) == original(text)
    assert by_json == []
    assert decode_json("[-9999999999999999999]") == [-9999999999999999999]
    assert decode_json('{"n": 1234567890123456789}') == {"n": 1234567890123456789}
    assert by_json == ["[-9999999999999999999]", '{"n": 1234567890123456789}']


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_recompute_frees_the_fleet_it_replaces_without_the_cyclic_collector(
    imported: None, collector_off: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker keeps one fleet per cluster (claims.livestate); the one a recompute replaces must go at
    # once, not at the collector's next full run (two fleets in memory: issue 11's 3.9 GB child).
    seen: list[weakref.ref[Any]] = []
    original = LiveFleet.state

    def spy(self: LiveFleet) -> FleetState:
        state = original(self)
        seen.append(weakref.ref(state))
        return state

    monkeypatch.setattr(LiveFleet, "state", spy)
    tasks.forget()
    assert tasks.recompute_diagnoses("fixtures")
    assert tasks.recompute_diagnoses("fixtures")
    tasks.forget()
    assert len(seen) == 2
    assert [ref() for ref in seen] == [None, None]  # freed by refcounting: released, cycle broken


@pytest.fixture
def from_db_spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[weakref.ref[Any], bool]]:
    """A weak reference to every state ``FleetState.from_db`` returns, and whether it was loaded lean."""
    seen: list[tuple[weakref.ref[Any], bool]] = []
    original = FleetState.from_db.__func__  # type: ignore[attr-defined]

    def spy(cls: type[FleetState], cluster: str | None = None, **kw: Any) -> FleetState:
        state = original(cls, cluster, **kw)
        seen.append((weakref.ref(state), bool(kw.get("lean"))))
        return state

    monkeypatch.setattr(FleetState, "from_db", classmethod(spy))
    return seen


def test_an_update_that_recomputes_lets_the_fleet_it_replaces_go_before_loading(
    imported: None, collector_off: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a failed update (no footprint) the next one recomputes: loading the new fleet while the
    # old one is still held would be two fleets at once (+1.4 GB at XL).
    tasks.forget()
    assert tasks.recompute_diagnoses("fixtures")
    old = weakref.ref(tasks._live["fixtures"].fleet)
    tasks._live["fixtures"].footprint = None
    alive_at_load: list[bool] = []
    original = LiveFleet.load.__func__  # type: ignore[attr-defined]

    def spy(cls: type[LiveFleet], cluster: str, mark: Any = None) -> LiveFleet:
        alive_at_load.append(old() is not None)
        return original(cls, cluster, mark)

    monkeypatch.setattr(LiveFleet, "load", classmethod(spy))
    assert tasks.update_diagnoses("fixtures").get("full") == 1
    tasks.forget()
    assert alive_at_load == [False]


@pytest.mark.parametrize("kind", ["ResourceSlice", "ResourceClaim", "Pod"])
def test_a_relist_read_whole_lets_the_kinds_old_objects_go_before_reading_it(
    imported: None, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # Held by the fleet's table, its indexes, device rows and the allocator's sums, the old objects would
    # stay while the new ones are read: the kind twice (the slices: +0.6 GB at XL).
    from claims import livestate

    tasks.forget()
    assert tasks.recompute_diagnoses("fixtures")  # a state built: rows, sums and indexes hold objects
    assert gc.get_freeze_count() == 0  # get_referrers below sees every holder
    live = tasks._live["fixtures"].fleet
    old = list(live.objects[kind].values())
    if kind == "ResourceClaim":  # those the allocator's sums and the holders index hold
        old = [c for c in old if "allocation" in c.get("status", {})]
    assert old
    holders_at_read: list[Any] = []
    original = livestate._stored

    def spy(read: str, rows: Any, shared: Any, *rest: Any) -> list[dict[str, Any]]:
        if read == kind:  # whatever still holds an old object besides this test's list of them
            holders_at_read.extend(r for o in old for r in gc.get_referrers(o) if r is not old)
        return original(read, rows, shared, *rest)

    monkeypatch.setattr(livestate, "_stored", spy)
    live.apply([(1, {"kind": kind, "resync": True})])
    tasks.forget()
    assert holders_at_read == []


def test_loading_a_state_never_pauses_the_collector(imported: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Web requests load (lean) states concurrently: their pauses could overlap without end.
    enabled: list[bool] = []
    original = fleetstate._stored

    def spy(kind: str, rows: Any, shared: dict[Any, Any] | None, *whole: Any) -> list[Any]:
        enabled.append(gc.isenabled())
        return original(kind, rows, shared, *whole)

    monkeypatch.setattr(fleetstate, "_stored", spy)
    assert gc.isenabled()
    FleetState.from_db("fixtures")
    FleetState.from_db("fixtures", lean=True)
    assert len(enabled) == 2 * len(fleetstate.stored_models()) and all(enabled)


def test_web_diagnoses_free_their_fleet_without_the_cyclic_collector(
    imported: None, collector_off: None, from_db_spy: list[tuple[weakref.ref[Any], bool]]
) -> None:
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIRequestFactory, force_authenticate

    from claims.api.diagnosis import ClaimDiagnosisView, WhatIfView
    from claims.models import ClaimDiagnosis
    from claims.selectors import diagnosis_page
    from fleet.access.visibility import Visibility, grant_all_namespaces

    user = get_user_model().objects.create_user("oncall", password="x-long-enough-password")
    grant_all_namespaces(user)
    pending = ResourceClaim.objects.filter(cluster__name="fixtures", state="pending").order_by("name")
    assert not ClaimDiagnosis.objects.exists()  # each path below computes a diagnosis now
    factory = APIRequestFactory()
    request = factory.post("/api/v1/whatif", {**pending[0].raw, "kind": "ResourceClaim"}, format="json")
    force_authenticate(request, user)
    assert WhatIfView.as_view()(request).status_code == 200
    request = factory.get(f"/api/v1/claims/{pending[0].pk}/diagnosis")
    force_authenticate(request, user)
    assert ClaimDiagnosisView.as_view()(request, pk=pending[0].pk).status_code == 200
    assert diagnosis_page(Visibility.everything(), pending[1]).result is not None
    assert len(from_db_spy) == 3
    assert [ref() for ref, _ in from_db_spy] == [None] * 3  # freed by refcounting: released, cycle broken
    # Each diagnoses a claim given from outside: a fifth of the memory.
    assert [lean for _, lean in from_db_spy] == [True] * 3


def test_worker_children_above_the_memory_backstop_are_replaced_after_their_task() -> None:
    from django.conf import settings

    from dashboard.celery import app

    expected = int(os.environ.get("CLAIMSCOPE_WORKER_MAX_MEMORY_MB", "1536")) * 1024  # KiB
    assert expected == settings.CELERY_WORKER_MAX_MEMORY_PER_CHILD
    assert app.conf.worker_max_memory_per_child == expected
