"""Fleet simulator: specs and presets, list/watch/410 semantics, the naive stand-in scheduler, scenarios."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator import nvidia as nv
from simulator.cluster import SimulatedCluster
from simulator.naive_schedule import naive_schedule
from simulator.scenarios import monday
from simulator.scheduling import Decision, Schedule
from simulator.scheduling_allocator import allocator_schedule
from simulator.spec import build_fleet, load_spec, preset, spec_from_dict
from simulator.workloads import Simulation, product_is, random_workloads, training

Obj = dict[str, Any]


def _cluster_with(spec_name: str = "small", history_limit: int = 50_000) -> SimulatedCluster:
    cluster = SimulatedCluster(history_limit=history_limit)
    cluster.bulk_create(build_fleet(preset(spec_name)).objects())
    return cluster


# ---- specs -----------------------------------------------------------------------------------------------


def test_same_seed_gives_the_same_objects() -> None:
    a = build_fleet(preset("medium", seed=3))
    b = build_fleet(preset("medium", seed=3))
    assert list(a.objects()) == list(b.objects())
    c = build_fleet(preset("medium", seed=4))
    assert [n["metadata"]["name"] for n in c.nodes] == [n["metadata"]["name"] for n in a.nodes]
    assert list(c.objects()) != list(a.objects()), "the seed drives taints and random MIG layouts"


@pytest.mark.parametrize(
    ("name", "nodes", "gpus"),
    [("small", 6, 48), ("medium", 200, 1_600), ("L", 5_000, 40_000)],
)
def test_presets_have_their_documented_size(name: str, nodes: int, gpus: int) -> None:
    spec = preset(name)
    assert spec.node_count == nodes
    assert spec.gpu_count == gpus
    fleet = build_fleet(spec)  # L takes ~4 s here, well under the 20 s budget
    assert len(fleet.nodes) == nodes
    assert sum(fleet.physical_gpus().values()) == gpus
    models = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in fleet.nodes}
    if name != "small":
        assert {"NVIDIA-B200", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-B300-SXM6-AC"} <= models
    # Every GPU is visible exactly once as a full GPU or as the parent of MIG devices.
    parents = set()
    for s in fleet.slices:
        for d in s["spec"].get("devices", []):
            attrs = d["attributes"]
            if "parentUUID" in attrs:
                parents.add(attrs["parentUUID"]["string"])
            elif attrs["type"]["string"] == "gpu":
                parents.add(attrs["uuid"]["string"])
    assert len(parents) == gpus


def test_spec_from_yaml_and_validation(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "lab",
                "seed": 1,
                "pools": [
                    {"name": "a", "model": "A100", "nodes": 2, "mode": "static-mig", "layout": "all-1g"},
                    {"name": "g", "model": "GB200", "nodes": 2, "gpus": 4, "clique_size": 2},
                ],
            }
        )
    )
    spec = load_spec(path)
    assert (spec.node_count, spec.gpu_count) == (4, 24)
    fleet = build_fleet(spec)
    assert fleet.nodes[2]["metadata"]["labels"]["nvidia.com/gpu.clique"] == "lab-g.0"
    with pytest.raises(ValueError, match="unknown model"):
        spec_from_dict({"pools": [{"name": "x", "model": "T4", "nodes": 1}]})
    with pytest.raises(ValueError, match="unknown fleet spec keys"):
        spec_from_dict({"pools": [], "colour": "red"})
    with pytest.raises(KeyError):
        preset("XXL")


# ---- list / watch / 410 ----------------------------------------------------------------------------------


def test_list_returns_items_and_the_cluster_resource_version() -> None:
    cluster = _cluster_with()
    nodes, rv = cluster.list("Node")
    assert len(nodes) == 6
    assert int(rv) == int(cluster.resource_version)
    rvs = [
        int(o["metadata"]["resourceVersion"])
        for k in ("DeviceClass", "Node", "ResourceSlice")
        for o in cluster.list(k)[0]
    ]
    assert len(set(rvs)) == len(rvs)
    assert max(rvs) == int(rv)
    with pytest.raises(ValueError, match="unsupported kind"):
        cluster.list("ConfigMap")


def test_watch_replays_changes_after_the_version_then_bookmarks() -> None:
    cluster = _cluster_with()
    _, rv = cluster.list("ResourceClaim")
    claim = nv.claim_object("ns", "c1", [nv.exactly_request("gpu", "gpu.nvidia.com")])
    cluster.create(claim)
    cluster.create(nv.pod_object("ns", "p1", [("gpu", nv.from_claim("c1"))]))  # other kind: filtered out
    stored = cluster.get("ResourceClaim", "ns", "c1")
    assert stored is not None
    cluster.update(
        {**stored, "status": nv.allocation_status([{"request": "gpu", "device": "gpu-0"}], "b200-0000")}
    )
    cluster.delete("ResourceClaim", "ns", "c1")
    events = list(cluster.watch("ResourceClaim", rv))
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions)
    assert events[-1]["object"]["metadata"]["resourceVersion"] == cluster.resource_version
    # Resuming from the bookmark yields nothing new.
    assert [e["type"] for e in cluster.watch("ResourceClaim", cluster.resource_version)] == ["BOOKMARK"]


def test_watch_from_zero_starts_with_synthetic_adds() -> None:
    cluster = _cluster_with()
    events = list(cluster.watch("Node", "0"))
    assert [e["type"] for e in events] == ["ADDED"] * 6 + ["BOOKMARK"]


def test_it_answers_410_when_the_version_is_compacted() -> None:
    cluster = _cluster_with(history_limit=10)
    events = list(cluster.watch("Node", "1001"))
    assert len(events) == 1
    assert events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert status["message"].startswith("too old resource version: 1001")
    # A relist gives a version that can be watched again.
    _, rv = cluster.list("Node")
    assert [e["type"] for e in cluster.watch("Node", rv)] == ["BOOKMARK"]
    cluster.compact()
    stale = str(int(rv) - 1)
    assert next(iter(cluster.watch("Node", stale)))["type"] == "ERROR"


def test_a_blocking_watch_sees_writes_from_another_thread() -> None:
    cluster = _cluster_with()
    _, rv = cluster.list("Pod")
    writer = threading.Thread(target=lambda: cluster.create(nv.pod_object("ns", "late", [])))
    stream = cluster.watch("Pod", rv, timeout_seconds=10)
    writer.start()
    first = next(stream)
    writer.join()
    assert first["type"] == "ADDED"
    assert first["object"]["metadata"]["name"] == "late"
    stream.close()  # type: ignore[attr-defined]  # a generator underneath


def test_bad_resource_version_is_a_400() -> None:
    cluster = _cluster_with()
    (event,) = list(cluster.watch("Node", "abc"))
    assert event["object"]["code"] == 400


# ---- naive scheduler ---------------------------------------------------------------------------------------


def _claim(ns: str, name: str, requests: list[Obj], constraints: list[Obj] | None = None) -> Obj:
    return nv.claim_object(ns, name, requests, constraints)


def test_naive_schedule_first_fit_full_gpus_and_first_available() -> None:
    cluster = _cluster_with()
    pod = nv.pod_object("ns", "p", [])
    d = naive_schedule(
        pod, [_claim("ns", "c", [nv.exactly_request("gpu", "gpu.nvidia.com", count=4)])], cluster
    )
    assert d.ok
    assert d.node == "b200-0000"
    assert [r["device"] for r in d.allocations["ns/c"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    fa = nv.first_available_request(
        "mig",
        [
            nv.subrequest(
                "big",
                "mig.nvidia.com",
                selectors=["device.attributes['gpu.nvidia.com'].profile == '7g.80gb'"],
            ),
            nv.subrequest(
                "small",
                "mig.nvidia.com",
                selectors=["device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"],
            ),
        ],
    )
    d = naive_schedule(pod, [_claim("ns", "m", [fa])], cluster)
    # No static 7g anywhere but the DynamicMIG node offers one; nodes are tried in name order.
    assert d.node == "h100-dyn-0000"
    assert d.allocations["ns/m"][0]["request"] == "mig/big"


def test_naive_schedule_honours_dynamic_counters() -> None:
    cluster = _cluster_with()
    pod = nv.pod_object("ns", "p", [])
    only_dyn = ["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"]
    # Take every full GPU of the dynamic node (static MIG nodes have no full GPUs).
    d = naive_schedule(
        pod, [_claim("ns", "c", [nv.exactly_request("g", "gpu.nvidia.com", 8, only_dyn)])], cluster
    )
    assert d.node == "h100-dyn-0000"
    cluster.create(
        nv.claim_object(
            "ns",
            "c",
            [nv.exactly_request("g", "gpu.nvidia.com", 8)],
            status=nv.allocation_status(d.allocations["ns/c"], d.node),
        )
    )
    mig7 = nv.exactly_request(
        "m", "mig.nvidia.com", selectors=["device.attributes['gpu.nvidia.com'].profile == '7g.80gb'"]
    )
    d2 = naive_schedule(pod, [_claim("ns", "m", [mig7])], cluster)
    assert not d2.ok
    assert d2.reason == "Unschedulable"
    assert d2.message == nv.fit_error_message(6, {"cannot allocate all claims": 6})


def test_naive_schedule_reports_cel_runtime_errors_as_scheduler_errors() -> None:
    cluster = _cluster_with()
    bad = nv.exactly_request(
        "gpu", "gpu.nvidia.com", selectors=["device.attributes['gpu.nvidia.com'].gpuMemoryGiB >= 80"]
    )
    d = naive_schedule(nv.pod_object("ns", "p", []), [_claim("ns", "bad", [bad])], cluster)
    assert d == Decision.failure(
        'running "DynamicResources" filter plugin: claim ns/bad: selector #0: '
        "CEL runtime error: no such key: gpuMemoryGiB",
        reason="SchedulerError",
    )


def test_naive_schedule_match_attribute_groups_devices() -> None:
    cluster = _cluster_with()
    req = nv.exactly_request("gpus", "gpu.nvidia.com", count=2)
    pair = [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    d = naive_schedule(nv.pod_object("ns", "p", []), [_claim("ns", "c", [req], pair)], cluster)
    assert [r["device"] for r in d.allocations["ns/c"]] == ["gpu-0", "gpu-1"]
    three = [{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    d3 = naive_schedule(
        nv.pod_object("ns", "p", []),
        [_claim("ns", "c", [{**req, "exactly": {**req["exactly"], "count": 3}}], three)],
        cluster,
    )
    assert not d3.ok


# ---- simulation and scenarios -----------------------------------------------------------------------------


def test_a_job_runs_finishes_and_frees_its_devices() -> None:
    cluster = _cluster_with()
    start = datetime(2026, 3, 6, 17, 0, tzinfo=UTC)
    sim = Simulation(cluster, naive_schedule, start)
    sim.submit(training("ml", "job", start, 4, [], 2))
    sim.run(start + timedelta(hours=1))
    (pod,) = cluster.list("Pod")[0]
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] == "b200-0000"
    (claim,) = cluster.list("ResourceClaim")[0]
    assert claim["status"]["reservedFor"][0]["uid"] == pod["metadata"]["uid"]
    assert len(cluster.allocated_devices()) == 4
    sim.run(start + timedelta(hours=3))
    assert cluster.list("Pod")[0] == []
    assert cluster.list("ResourceClaim")[0] == []
    assert cluster.allocated_devices() == {}


def test_a_compressed_simulation_ends_queued_jobs_and_retries_pending_pods_sooner() -> None:
    cluster = _cluster_with()
    start = datetime(2026, 3, 6, 17, 0, tzinfo=UTC)
    sim = Simulation(cluster, naive_schedule, start)
    b200 = [product_is("NVIDIA B200")]
    for name in ("first", "second", "third"):  # the small fleet has two B200 nodes: the third waits
        sim.submit(training("ml", name, start, 8, b200, 30))
    sim.run(start + timedelta(hours=1))
    third = cluster.get("Pod", "ml", "third-0")
    assert third is not None and not third["spec"].get("nodeName")
    sim.compress(60)
    assert sim.retry_every == timedelta(seconds=30)
    # The first two end 29 h after the compression, so 29 min later; the waiting pod is then retried
    # within 30 s instead of 30 min.
    sim.run(start + timedelta(hours=1, minutes=29, seconds=30))
    assert cluster.get("Pod", "ml", "first-0") is None
    third = cluster.get("Pod", "ml", "third-0")
    assert third is not None and third["spec"].get("nodeName")


@pytest.mark.parametrize("schedule", [None, allocator_schedule], ids=["naive-stand-in", "allocator-replay"])
def test_monday_tells_the_on_call_story(schedule: Schedule | None) -> None:
    s = monday(seed=0, schedule=schedule)
    pods = {p["metadata"]["name"]: p for p in s.cluster.list("Pod")[0]}
    reasons = Counter(
        (
            p["metadata"]["labels"].get("claimscope.io/workload-kind"),
            p["status"]["conditions"][0].get("reason"),
        )
        for p in pods.values()
        if p["status"]["phase"] == "Pending"
    )
    assert reasons == {
        ("training", "Unschedulable"): 9,  # want >= 150Gi: only B200/B300 fit, all held
        ("inference", "Unschedulable"): 5,  # 1g gone, 3g idle
        ("broken-cel", "SchedulerError"): 1,
        ("unknown-attribute", "SchedulerError"): 1,
        ("impossible-memory", "Unschedulable"): 1,
    }
    allocated = s.cluster.allocated_devices()
    big = [k for k in allocated if k[1].startswith(("b200-", "b300-"))]
    assert len(big) == 24
    three_g = [k for k in allocated if k[1] == "h100-3g-0000"]
    assert len(three_g) == 4  # 12 of 16 3g slices idle
    one_g = [k for k in allocated if k[1] == "h100-1g-0000"]
    assert len(one_g) == 56
    leaked = [
        c
        for c in s.cluster.list("ResourceClaim")[0]
        if c.get("status", {}).get("allocation") and not c["status"].get("reservedFor")
    ]
    assert [c["metadata"]["name"] for c in leaked] == ["notebook-alice-gpu"]
    failed = [e for e in s.cluster.list("Event")[0] if e["reason"] == "FailedScheduling"]
    assert all(e["count"] >= 1 for e in failed)
    assert max(e["count"] for e in failed) > 50  # retried all weekend


def test_monday_is_deterministic_for_a_seed() -> None:
    a, b = monday(seed=5), monday(seed=5)
    assert a.events == b.events
    assert monday(seed=6).events != a.events


def test_random_workloads_are_seeded() -> None:
    fleet = build_fleet(preset("small"))
    start = datetime(2026, 3, 6, 17, 0, tzinfo=UTC)
    a = random_workloads(fleet, 1, start, 4)
    assert a == random_workloads(fleet, 1, start, 4)
    assert a != random_workloads(fleet, 2, start, 4)
    kinds = Counter(w.kind for w in a)
    assert kinds["training"] > 0
    assert kinds["inference"] > 0
    cluster = SimulatedCluster()
    sim = Simulation(cluster, naive_schedule, start)
    sim.load_fleet(fleet)
    for w in a:
        sim.submit(w)
    sim.run(start + timedelta(hours=6))
    # No device is ever double-booked: the allocation index has one owner per device by construction,
    # so compare it with the claims themselves.
    owners = Counter(
        (r["driver"], r["pool"], r["device"])
        for c in cluster.list("ResourceClaim")[0]
        for r in c.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        if not r.get("adminAccess")
    )
    assert all(n == 1 for n in owners.values())


def test_an_xid_taints_every_device_of_that_gpu_only() -> None:
    cluster = SimulatedCluster()
    sim = Simulation(cluster, naive_schedule, datetime(2026, 3, 6, 17, 0, tzinfo=UTC))
    pool = {"name": "h", "model": "H100", "nodes": 1, "mode": "static-mig", "layout": "all-1g"}
    sim.load_fleet(build_fleet(spec_from_dict({"pools": [pool]})))
    node = cluster.list("Node")[0][0]["metadata"]["name"]
    sim.xid(sim.now + timedelta(minutes=1), node, gpu_minor=2)
    sim.run(sim.now + timedelta(minutes=2))
    devices = [d for s in cluster.slices_by_node()[node] for d in s["spec"]["devices"]]
    tainted = {d["name"] for d in devices if d.get("taints")}
    assert tainted and all(name.startswith("gpu-2-") for name in tainted)
    assert len(tainted) == 7
    assert all(t["effect"] == "NoSchedule" for d in devices for t in d.get("taints", []))


def test_a_vanished_node_takes_its_slices_and_pods_and_frees_their_claims() -> None:
    cluster = SimulatedCluster()
    sim = Simulation(cluster, naive_schedule, datetime(2026, 3, 6, 17, 0, tzinfo=UTC))
    sim.load_fleet(build_fleet(spec_from_dict({"pools": [{"name": "b", "model": "B200", "nodes": 2}]})))
    sim.submit(training("ml", "job", sim.now, 8, [], None))
    sim.run(sim.now + timedelta(minutes=1))
    (pod,) = cluster.list("Pod")[0]
    node = pod["spec"]["nodeName"]
    assert cluster.allocated_devices()
    sim.node_loss(sim.now + timedelta(minutes=1), node)
    sim.run(sim.now + timedelta(minutes=2))
    assert node not in {n["metadata"]["name"] for n in cluster.list("Node")[0]}
    assert node not in cluster.slices_by_node()
    assert cluster.list("Pod")[0] == []
    assert cluster.allocated_devices() == {}


def test_the_xl_preset_is_15000_nodes_120000_gpus_and_about_a_million_devices() -> None:
    spec = preset("XL")
    assert (spec.node_count, spec.gpu_count) == (15_000, 120_000)
    # Devices per node of each pool, from one built node of that pool (building all of XL takes minutes).
    devices = 0
    for pool in spec.pools:
        one = build_fleet(spec_from_dict({"pools": [{**dataclasses.asdict(pool), "nodes": 1}]}))
        per_node = sum(
            len(s["spec"].get("devices", [])) for s in one.slices if s["spec"]["driver"] == "gpu.nvidia.com"
        )
        devices += per_node * pool.nodes
    assert 950_000 <= devices <= 1_150_000, devices
