"""The structured-allocator replay on small fleets."""

import copy

import pytest

from claims.allocator import UNSUPPORTED, Features, FleetSnapshot, allocate, schedule_pod
from simulator import nvidia as nv

DRIVER = "dra.example.com"


def device_class(name="example", expression=f"device.driver == '{DRIVER}'"):
    return {
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def dev(name, **attrs):
    device = {"name": name, "attributes": {k: _attr(v) for k, v in attrs.items()}}
    return device


def _attr(value):
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def rslice(name, devices, node="node-1", pool=None, generation=1, count=1, **spec):
    body = {
        "driver": DRIVER,
        "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
    }
    if node and not any(k in spec for k in ("allNodes", "nodeSelector", "perDeviceNodeSelection")):
        body["nodeName"] = node
    body.update(spec)
    if devices is not None:
        body["devices"] = devices
    return {"kind": "ResourceSlice", "metadata": {"name": name}, "spec": body}


def node(name, **labels):
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


def claim(name="c", requests=None, constraints=None, **exact):
    if requests is None:
        requests = [{"name": "req", "exactly": {"deviceClassName": "example", **exact}}]
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": requests, "constraints": constraints or []}},
    }


def allocated(name, *devices, pool="node-1", admin=False):
    c = claim(name)
    c["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "req",
                        "driver": DRIVER,
                        "pool": pool,
                        "device": d,
                        "adminAccess": admin or None,
                    }
                    for d in devices
                ]
            }
        }
    }
    return c


def fleet(*objs):
    return FleetSnapshot.from_objects([device_class(), node("node-1"), node("node-2"), *objs])


def picked(result):
    return [r["device"] for a in result.allocations.values() for r in a["devices"]["results"]]


def test_it_allocates_first_fit_in_slice_order():
    snap = fleet(rslice("s", [dev("a"), dev("b"), dev("c")]))
    result = allocate([claim(count=2)], "node-1", snap)
    assert result.ok
    assert picked(result) == ["a", "b"]
    alloc = result.allocations["ns/c"]
    assert alloc["devices"]["results"][0] == {
        "request": "req",
        "driver": DRIVER,
        "pool": "node-1",
        "device": "a",
    }
    assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-1"]


def test_pools_are_sorted_by_driver_and_name_and_slices_by_name():
    snap = fleet(
        rslice("z-slice", [dev("z0")], pool="b-pool", allNodes=True),
        rslice("b-slice", [dev("b0")], pool="a-pool", allNodes=True, count=2),
        rslice("a-slice", [dev("a0")], pool="a-pool", allNodes=True, count=2),
    )
    assert picked(allocate([claim(count=3)], "node-1", snap)) == ["a0", "b0", "z0"]


def test_only_the_highest_generation_counts():
    snap = fleet(rslice("old", [dev("old")], generation=1), rslice("new", [dev("new")], generation=2))
    assert picked(allocate([claim()], "node-1", snap)) == ["new"]


def test_an_incomplete_pool_is_skipped_and_all_mode_fails_fatally():
    snap = fleet(rslice("s", [dev("a")], count=2))
    result = allocate([claim()], "node-1", snap)
    assert (result.kind, result.message) == ("unschedulable", "cannot allocate all claims")
    result = allocate([claim(allocationMode="All")], "node-1", snap)
    assert result.kind == "error"
    assert result.message == (
        "claim ns/c, request req: asks for all devices, but resource pool dra.example.com/node-1 "
        "is currently being updated"
    )


def test_an_invalid_pool_rejects_the_node():
    snap = fleet(rslice("s", [dev("a"), dev("a")]))
    result = allocate([claim()], "node-1", snap)
    assert (result.kind, result.message) == ("unschedulable", "invalid resource pools were encountered")


def test_node_relevance_by_name_selector_all_nodes_and_per_device():
    selector = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
    }
    fields = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n3"]}]}]
    }
    snap = FleetSnapshot.from_objects(
        [
            device_class(),
            node("n1", zone="a"),
            node("n2", zone="b"),
            node("n3"),
            rslice("by-name", [dev("named")], node="n2", pool="p1"),
            rslice("by-label", [dev("labelled")], node=None, pool="p2", nodeSelector=selector),
            rslice("by-field", [dev("fielded")], node=None, pool="p3", nodeSelector=fields),
            rslice("every", [dev("shared")], node=None, pool="p4", allNodes=True),
            rslice(
                "per-device",
                [{**dev("mine"), "nodeName": "n1"}, {**dev("theirs"), "nodeName": "n2"}],
                node=None,
                pool="p5",
                perDeviceNodeSelection=True,
            ),
        ]
    )
    all_mode = claim(allocationMode="All")
    assert sorted(picked(allocate([all_mode], "n1", snap))) == ["labelled", "mine", "shared"]
    assert sorted(picked(allocate([all_mode], "n2", snap))) == ["named", "shared", "theirs"]
    assert sorted(picked(allocate([all_mode], "n3", snap))) == ["fielded", "shared"]
    result = allocate([claim()], "n1", snap)
    assert result.allocations["ns/c"]["nodeSelector"] == selector  # merged slice selector


def test_class_then_request_selectors_filter_devices():
    snap = fleet(
        rslice("s", [dev("a", kind="cpu"), dev("b", kind="gpu", mem=10), dev("c", kind="gpu", mem=80)])
    )
    req = claim(selectors=[{"cel": {"expression": f"device.attributes['{DRIVER}'].mem >= 40"}}])
    snap.classes["example"] = device_class(expression=f"device.attributes['{DRIVER}'].kind == 'gpu'")
    assert picked(allocate([req], "node-1", snap)) == ["c"]


def test_a_class_selector_runtime_error_aborts_scheduling():
    snap = fleet(rslice("s", [dev("a")]))
    snap.classes["example"] = device_class(expression=f"device.attributes['{DRIVER}'].missing == 'x'")
    result = allocate([claim()], "node-1", snap)
    assert result.kind == "error"
    assert result.message.startswith(
        "class example: selector #0 on device dra.example.com/node-1/a: "
        "CEL runtime error: no such key: missing. "
        "consider using CEL optional chaining"
    )


def test_a_claim_selector_compile_error_is_fatal():
    snap = fleet(rslice("s", [dev("a")]))
    bad = claim(selectors=[{"cel": {"expression": "device.capacity['x'].memory >= quantity('1')"}}])
    result = allocate([bad], "node-1", snap)
    assert result.kind == "error"
    assert result.message.startswith("claim ns/c: selector #0: CEL compile error: compilation failed:")


def test_a_missing_class_is_an_error():
    result = allocate(
        [claim(requests=[{"name": "r", "exactly": {"deviceClassName": "nope"}}])], "node-1", fleet()
    )
    assert (result.kind, result.message) == ("error", "request r: device class nope does not exist")


def test_allocated_devices_are_in_use_but_admin_access_results_are_not():
    snap = fleet(
        rslice("s", [dev("a"), dev("b")]), allocated("other", "a"), allocated("admin", "b", admin=True)
    )
    assert picked(allocate([claim()], "node-1", snap)) == ["b"]
    assert not allocate([claim(count=2)], "node-1", snap).ok


def test_admin_access_may_reuse_allocated_devices():
    snap = fleet(rslice("s", [dev("a")]), allocated("other", "a"))
    result = allocate([claim(adminAccess=True)], "node-1", snap)
    assert picked(result) == ["a"]
    assert result.allocations["ns/c"]["devices"]["results"][0]["adminAccess"] is True


def test_devices_are_not_reused_across_claims_of_one_pod():
    snap = fleet(rslice("s", [dev("a"), dev("b")]))
    result = allocate([claim("one"), claim("two")], "node-1", snap)
    assert picked(result) == ["a", "b"]
    assert not allocate([claim("one"), claim("two"), claim("three")], "node-1", snap).ok


@pytest.mark.parametrize(
    ("toleration", "ok"),
    [
        (None, False),
        ({"key": "health", "operator": "Exists"}, True),
        ({"key": "health", "operator": "Equal", "value": "bad", "effect": "NoSchedule"}, True),
        ({"key": "health", "value": "other"}, False),
        ({"key": "health", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),
    ],
)
def test_taints_block_unless_tolerated(toleration, ok):
    tainted = {**dev("a"), "taints": [{"key": "health", "value": "bad", "effect": "NoSchedule"}]}
    snap = fleet(rslice("s", [tainted]))
    req = claim(tolerations=[toleration] if toleration else [])
    assert allocate([req], "node-1", snap).ok is ok


def test_informational_taints_do_not_block():
    snap = fleet(rslice("s", [{**dev("a"), "taints": [{"key": "x", "effect": "None"}]}]))
    assert allocate([claim()], "node-1", snap).ok


def test_shared_counters_limit_partitions():
    counters = rslice(
        "counters", None, count=2, sharedCounters=[{"name": "cs", "counters": {"mem": {"value": "8"}}}]
    )

    def part(name, size):
        return {
            **dev(name),
            "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": str(size)}}}],
        }

    devices = rslice("devices", [part("p1", 4), part("p2", 4), part("p3", 4)], count=2)
    snap = fleet(counters, devices)
    assert picked(allocate([claim(count=2)], "node-1", snap)) == ["p1", "p2"]
    assert not allocate([claim(count=3)], "node-1", snap).ok
    snap_used = fleet(counters, devices, allocated("other", "p3"))
    assert picked(allocate([claim()], "node-1", snap_used)) == ["p1"]
    assert not allocate([claim(count=2)], "node-1", snap_used).ok


def test_consumable_capacity_shares_a_device():
    shared = {
        **dev("a"),
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "10Gi",
                "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
            }
        },
    }
    snap = fleet(rslice("s", [shared]))
    req = claim(capacity={"requests": {"memory": "3500Mi"}})
    result = allocate([req], "node-1", snap)
    entry = result.allocations["ns/c"]["devices"]["results"][0]
    assert entry["consumedCapacity"] == {"memory": str(4 * 2**30)}  # rounded up to the 1Gi step
    assert entry["shareID"]
    assert allocate(
        [
            claim("x", capacity={"requests": {"memory": "5Gi"}}),
            claim("y", capacity={"requests": {"memory": "5Gi"}}),
        ],
        "node-1",
        snap,
    ).ok
    assert not allocate(
        [
            claim("x", capacity={"requests": {"memory": "6Gi"}}),
            claim("y", capacity={"requests": {"memory": "5Gi"}}),
        ],
        "node-1",
        snap,
    ).ok


def test_capacity_requests_filter_ordinary_devices():
    small = {**dev("small"), "capacity": {"memory": {"value": "10Gi"}}}
    big = {**dev("big"), "capacity": {"memory": {"value": "80Gi"}}}
    snap = fleet(rslice("s", [small, dev("none"), big]))
    assert picked(allocate([claim(capacity={"requests": {"memory": "40Gi"}})], "node-1", snap)) == ["big"]


def test_capacity_requests_need_the_feature():
    snap = fleet(rslice("s", [dev("a")]))
    result = allocate(
        [claim(capacity={"requests": {"memory": "1"}})],
        "node-1",
        snap,
        features=Features(consumable_capacity=False),
    )
    assert result.kind == "error"
    assert "has capacity requests, but the DRAConsumableCapacity feature is disabled" in result.message
    assert result.reason == UNSUPPORTED  # a gate off is the cluster's version, not the claim's CEL


def test_all_mode_takes_every_matching_device_and_needs_at_least_one():
    snap = fleet(rslice("s", [dev("a"), dev("b")]))
    assert picked(allocate([claim(allocationMode="All")], "node-1", snap)) == ["a", "b"]
    busy = fleet(rslice("s", [dev("a"), dev("b")]), allocated("other", "b"))
    assert not allocate([claim(allocationMode="All")], "node-1", busy).ok


def test_first_available_prefers_the_first_subrequest_that_lets_everything_fit():
    snap = fleet(rslice("s", [dev("small", size=1), dev("big", size=8)]))
    snap.classes["small"] = device_class("small", f"device.attributes['{DRIVER}'].size == 1")
    snap.classes["big"] = device_class("big", f"device.attributes['{DRIVER}'].size == 8")
    prio = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "s", "deviceClassName": "small"},
            {"name": "b", "deviceClassName": "big"},
        ],
    }
    result = allocate([claim(requests=[prio])], "node-1", snap)
    assert result.allocations["ns/c"]["devices"]["results"][0]["request"] == "gpu/s"
    # a second request needs the small device: the first request falls back to its second choice
    other = {"name": "other", "exactly": {"deviceClassName": "small"}}
    result = allocate([claim(requests=[prio, other])], "node-1", snap)
    assert [(r["request"], r["device"]) for r in result.allocations["ns/c"]["devices"]["results"]] == [
        ("gpu/b", "big"),
        ("other", "small"),
    ]


def test_match_attribute_backtracks_to_a_consistent_set():
    devices = [dev("a0", parent="A"), dev("b0", parent="B"), dev("b1", parent="B"), dev("x")]
    snap = fleet(rslice("s", devices))
    constraint = [{"matchAttribute": f"{DRIVER}/parent"}]
    assert picked(allocate([claim(count=2, constraints=constraint)], "node-1", snap)) == ["b0", "b1"]
    assert not allocate([claim(count=3, constraints=constraint)], "node-1", snap).ok


def test_match_attribute_accepts_fully_qualified_and_bare_names():
    devices = [dev("a", parent="A"), {"name": "b", "attributes": {f"{DRIVER}/parent": {"string": "A"}}}]
    snap = fleet(rslice("s", devices))
    assert picked(
        allocate([claim(count=2, constraints=[{"matchAttribute": f"{DRIVER}/parent"}])], "node-1", snap)
    ) == ["a", "b"]


def test_match_attribute_applies_only_to_named_requests():
    snap = fleet(rslice("s", [dev("a", p="A"), dev("b", p="B"), dev("c", p="B")]))
    requests = [{"name": n, "exactly": {"deviceClassName": "example"}} for n in ("x", "y", "z")]
    result = allocate(
        [claim(requests=requests, constraints=[{"requests": ["y", "z"], "matchAttribute": f"{DRIVER}/p"}])],
        "node-1",
        snap,
    )
    assert picked(result) == ["a", "b", "c"]


def test_distinct_attribute_requires_different_values():
    snap = fleet(rslice("s", [dev("a", bus=1), dev("b", bus=1), dev("c", bus=2)]))
    assert picked(
        allocate([claim(count=2, constraints=[{"distinctAttribute": f"{DRIVER}/bus"}])], "node-1", snap)
    ) == ["a", "c"]


def test_all_mode_constraint_violation_is_fatal():
    snap = fleet(rslice("s", [dev("a", p="A"), dev("b", p="B")]))
    result = allocate(
        [claim(allocationMode="All", constraints=[{"matchAttribute": f"{DRIVER}/p"}])], "node-1", snap
    )
    assert result.kind == "error"
    assert (
        "cannot add device dra.example.com/node-1/b because a claim constraint would not be satisfied"
        in result.message
    )


def test_more_than_32_devices_is_fatal():
    snap = fleet(rslice("s", [dev(f"d{i}") for i in range(40)]))
    result = allocate([claim(count=33)], "node-1", snap)
    assert result.kind == "error"
    assert (
        result.message == "claim ns/c, request req: adding 33 devices exceeds the claim limit of 32, "
        "with 0 already accounted for"
    )
    assert allocate([claim(count=32)], "node-1", snap).ok


def test_selector_results_are_shared_between_identical_devices():
    snap = fleet(rslice("s", [dev(f"d{i}", kind="gpu") for i in range(20)]))
    snap.classes["example"] = device_class(expression=f"device.attributes['{DRIVER}'].kind == 'gpu'")
    assert allocate([claim(allocationMode="All")], "node-1", snap).ok
    assert snap.stats.evaluations == 1
    assert snap.stats.saved == 19


def test_schedule_pod_reports_the_scheduler_histogram():
    snap = fleet(rslice("s", [dev("a")]), allocated("other", "a"))
    result = schedule_pod({}, [claim()], snap)
    assert result.node is None
    assert result.message == "0/2 nodes are available: 2 cannot allocate all claims."
    free = fleet(rslice("s", [dev("a")], node="node-2"))
    assert schedule_pod({}, [claim()], free).node == "node-2"


def test_schedule_pod_surfaces_fatal_errors():
    snap = fleet(rslice("s", [dev("a")]))
    snap.classes["example"] = device_class(expression="device.attributes['x'].y == 1")
    result = schedule_pod({}, [claim()], snap)
    assert result.message.startswith('running "DynamicResources" filter plugin: class example: selector #0')


@pytest.fixture
def nvidia_fleet():
    objs = nv.device_classes()
    for name, mode, layout in (
        ("h100-full", "full", None),
        ("h100-mig", "static-mig", "balanced"),
        ("h100-dyn", "dynamic-mig", None),
    ):
        objs += nv.node_slices(name, "H100", mode=mode, layout=layout, gpus=2)
        objs.append(nv.node_object(name, "H100", gpus=2))
    return FleetSnapshot.from_objects(objs)


def _nv_claim(name, cls, count=1, selectors=(), constraints=()):
    exact = {
        "deviceClassName": cls,
        "count": count,
        "selectors": [{"cel": {"expression": s}} for s in selectors],
    }
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": exact}], "constraints": list(constraints)}
        },
    }


def test_nvidia_full_gpus_and_memory_selector(nvidia_fleet):
    want = _nv_claim(
        "big",
        "gpu.nvidia.com",
        2,
        ["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"],
    )
    result = schedule_pod({}, [want], nvidia_fleet)
    assert result.node == "h100-dyn"  # nodes in name order; the dynamic-MIG node also publishes full GPUs
    assert not allocate([want], "h100-mig", nvidia_fleet).ok


def test_nvidia_static_mig_profiles_with_same_parent(nvidia_fleet):
    want = _nv_claim(
        "mig",
        "mig.nvidia.com",
        2,
        ["device.attributes['gpu.nvidia.com'].profile in ['1g.10gb','2g.20gb']"],
        [{"matchAttribute": "gpu.nvidia.com/parentUUID"}],
    )
    result = allocate([want], "h100-mig", nvidia_fleet)
    assert result.ok
    devices = picked(result)
    assert devices[0].startswith("gpu-0-mig-1g10gb") and devices[1].startswith("gpu-0-mig-1g10gb")


def test_nvidia_dynamic_mig_counters_exclude_overlapping_placements(nvidia_fleet):
    full = _nv_claim("full", "gpu.nvidia.com", 2)
    result = allocate([full], "h100-dyn", nvidia_fleet)
    assert result.ok
    taken = copy.deepcopy(full)
    taken["status"] = {"allocation": result.allocations["ml/full"]}
    snap = copy.copy(nvidia_fleet)
    snap.allocated_claims = [taken]
    snap._results = {}
    assert not allocate([_nv_claim("mig", "mig.nvidia.com")], "h100-dyn", snap).ok


def _shareable(name, counters=False):
    device = {**dev(name), "allowMultipleAllocations": True, "capacity": {"memory": {"value": "10Gi"}}}
    if counters:
        device["consumesCounters"] = [{"counterSet": "cs", "counters": {"mem": {"value": "4"}}}]
    return device


def test_a_shareable_device_allocated_without_a_share_id_is_dedicated():
    # allocateddevices.go: a result without shareID goes to the dedicated set, whatever the device allows.
    snap = fleet(rslice("s", [_shareable("a")]), allocated("other", "a"))
    assert not allocate([claim(capacity={"requests": {"memory": "1Gi"}})], "node-1", snap).ok


def test_further_shares_of_a_device_do_not_charge_its_counters_again():
    counters = rslice(
        "counters", None, count=2, sharedCounters=[{"name": "cs", "counters": {"mem": {"value": "4"}}}]
    )
    snap = fleet(counters, rslice("devices", [_shareable("a", counters=True)], count=2))
    two = [
        claim("x", capacity={"requests": {"memory": "1Gi"}}),
        claim("y", capacity={"requests": {"memory": "1Gi"}}),
    ]
    assert picked(allocate(two, "node-1", snap)) == ["a", "a"]


def test_admin_access_reuses_a_share_of_the_same_claim_but_not_a_dedicated_device():
    # allocator_incubating.go allocateDevice: admin access skips devices this claim already holds
    # (allocatingDeviceForClaim), which records dedicated devices only; a share stays reusable.
    # Differential seed 1068249823 case 439.
    gib = {"capacity": {"requests": {"memory": "1Gi"}}}
    two = [
        {"name": "first", "exactly": {"deviceClassName": "example", **gib}},
        {"name": "admin", "exactly": {"deviceClassName": "example", "adminAccess": True, **gib}},
    ]
    shared = fleet(rslice("s", [_shareable("a")]))
    assert picked(allocate([claim(requests=two)], "node-1", shared)) == ["a", "a"]
    dedicated = fleet(rslice("s", [dev("a")]))
    assert not allocate([claim(requests=two)], "node-1", dedicated).ok


def test_admin_access_skips_a_device_of_the_same_claim_before_evaluating_its_selectors():
    # allocator_experimental.go allocateOne: "Checking for in use is cheap and thus gets done first";
    # for admin access that is allocatingDeviceForClaim, before isSelectable. A selector that fails
    # at runtime on a device the claim already holds never runs there. Differential seed 1553188859
    # case 733.
    needs_profile = [{"cel": {"expression": f"device.attributes['{DRIVER}'].profile == 'small'"}}]
    whole_only = [{"cel": {"expression": f"device.attributes['{DRIVER}'].kind == 'gpu'"}}]
    two = [
        {"name": "first", "exactly": {"deviceClassName": "example", "selectors": whole_only}},
        {
            "name": "admin",
            "exactly": {"deviceClassName": "example", "adminAccess": True, "selectors": needs_profile},
        },
    ]
    snap = fleet(rslice("s", [dev("whole", kind="gpu"), dev("part", kind="mig", profile="big")]))
    result = allocate([claim(requests=two)], "node-1", snap)
    assert (result.ok, result.kind) == (False, "unschedulable")
    # The same selector on a device the claim does not hold still aborts scheduling.
    alone = allocate([claim(requests=two[1:])], "node-1", snap)
    assert alone.kind == "error"
    assert "no such key: profile" in alone.message


def _big_or_small(count: int) -> dict:
    gpu = [{"cel": {"expression": f"device.attributes['{DRIVER}'].kind == 'gpu'"}}]
    return {
        "name": "a",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "example", "count": count, "selectors": gpu},
            {"name": "small", "deviceClassName": "example", "count": 1, "selectors": gpu},
        ],
    }


def test_a_request_past_the_claim_limit_falls_back_before_any_other_device_is_tried():
    # allocator_experimental.go allocateOne: a request whose remaining devices exceed the claim's 32
    # results returns errAllocationResultMaxSizeExceeded, which unwinds to the firstAvailable loop: the
    # next alternative is tried before another device of the first one, so d33's selector (no profile
    # attribute: a CEL runtime error) never runs. Upstream fits with a/small; checked against the
    # experimental allocator of k8s.io/dynamic-resource-allocation v0.37.2.
    devices = [dev(f"d{i:02}", kind="gpu", profile="x") for i in range(33)] + [dev("d33", kind="gpu")]
    wanted = [
        _big_or_small(31),
        {
            "name": "b",
            "exactly": {
                "deviceClassName": "example",
                "count": 2,
                "selectors": [{"cel": {"expression": f"device.attributes['{DRIVER}'].profile == 'x'"}}],
            },
        },
    ]
    result = allocate([claim(requests=wanted)], "node-1", fleet(rslice("s", devices)))
    assert result.ok, result.message
    got = result.allocations["ns/c"]["devices"]["results"]
    assert [(r["request"], r["device"]) for r in got] == [("a/small", "d00"), ("b", "d01"), ("b", "d02")]


def test_an_all_request_past_the_claim_limit_falls_back_before_its_constraint_is_checked():
    # The same unwinding before an All request's devices are taken (must=True there: a constraint that
    # fails on one of them is an error). Upstream fits with a/small.
    devices = [dev(f"g{i:02}", kind="gpu", model="m1") for i in range(31)] + [
        dev(f"m{i}", kind="mig", model="m2") for i in range(2)
    ]
    mig = [{"cel": {"expression": f"device.attributes['{DRIVER}'].kind == 'mig'"}}]
    wanted = [
        _big_or_small(31),
        {"name": "b", "exactly": {"deviceClassName": "example", "allocationMode": "All", "selectors": mig}},
    ]
    constraints = [{"matchAttribute": f"{DRIVER}/model", "requests": ["a/big", "b"]}]
    result = allocate(
        [claim(requests=wanted, constraints=constraints)], "node-1", fleet(rslice("s", devices))
    )
    assert result.ok, result.message
    got = result.allocations["ns/c"]["devices"]["results"]
    assert [(r["request"], r["device"]) for r in got] == [("a/small", "g00"), ("b", "m0"), ("b", "m1")]


def test_a_constraint_on_an_all_request_fails_before_the_capacity_of_a_full_shared_device():
    # allocator_experimental.go allocateDevice checks constraints before the capacity
    # (CmpRequestOverCapacity): an All request whose device misses the constrained attribute aborts
    # even when the device has no capacity left. Differential seed 488994655 case 750.
    held = allocated("other", "a")
    result = held["status"]["allocation"]["devices"]["results"][0]
    result.update(shareID="4ad0d1c5-3f35-4b6e-9f0b-6c4a4f7f4a01", consumedCapacity={"memory": "9Gi"})
    snap = fleet(rslice("s", [_shareable("a")]), held)
    want = claim(
        constraints=[{"distinctAttribute": f"{DRIVER}/parent"}],
        allocationMode="All",
        capacity={"requests": {"memory": "2Gi"}},
    )
    result = allocate([want], "node-1", snap)
    assert (result.kind, result.message) == (
        "error",
        f"claim ns/c, request req: cannot add device {DRIVER}/node-1/a because a claim constraint "
        "would not be satisfied",
    )
    roomy = allocate([claim(allocationMode="All", capacity={"requests": {"memory": "1Gi"}})], "node-1", snap)
    assert picked(roomy) == ["a"]


def test_an_allocated_device_of_an_older_pool_generation_consumes_no_counters():
    # allocator_experimental.go charges an allocated device's counters as the pool's current slices
    # publish it. Generation 1 (mig-a, 40Gi, held) is left over while generation 2 publishes mig-b, which
    # takes all 80Gi: upstream allocates mig-b (checked against the experimental allocator of v0.37.2).
    def counters(name: str, generation: int) -> dict:
        return rslice(
            name,
            None,
            generation=generation,
            count=2,
            sharedCounters=[{"name": "cs", "counters": {"memory": {"value": "80Gi"}}}],
        )

    def mig(name: str, memory: str) -> dict:
        return {
            **dev(name, kind="mig"),
            "consumesCounters": [{"counterSet": "cs", "counters": {"memory": {"value": memory}}}],
        }

    slices = [
        counters("a-counters", 1),
        rslice("a-devices", [mig("mig-a", "40Gi")], generation=1, count=2),
        counters("b-counters", 2),
        rslice("b-devices", [mig("mig-b", "80Gi")], generation=2, count=2),
    ]
    result = allocate([claim()], "node-1", fleet(*slices, allocated("holder", "mig-a")))
    assert picked(result) == ["mig-b"]


def test_admin_access_consumes_counters_like_any_allocation():
    counters = rslice(
        "counters", None, count=2, sharedCounters=[{"name": "cs", "counters": {"mem": {"value": "4"}}}]
    )
    part = {**dev("p"), "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "4"}}}]}
    snap = fleet(counters, rslice("devices", [part], count=2), allocated("other", "p"))
    assert not allocate([claim(adminAccess=True)], "node-1", snap).ok


def test_schedule_pod_aborts_on_a_fatal_error_on_a_later_node_even_if_an_earlier_one_fits():
    # Filter runs on all nodes in parallel; an All request on an incomplete pool is fatal there.
    snap = fleet(
        rslice("s1", [dev("a")], node="node-1"),
        rslice("s2", [dev("b")], node="node-2", count=2),
    )
    result = schedule_pod({}, [claim(allocationMode="All")], snap)
    assert result.node is None
    assert result.message.endswith(
        "asks for all devices, but resource pool dra.example.com/node-2 is currently being updated"
    )


def test_a_snapshot_from_lists_by_kind_is_the_one_sorted_from_mixed_objects() -> None:
    # FleetState lists each kind apart: the snapshot takes its lists rather than dispatch every object.
    held = nv.claim_object(
        "team", "held", [], status=nv.allocation_status([{"request": "gpu", "device": "gpu-0"}], "n1")
    )
    pending = nv.claim_object("team", "pending", [nv.exactly_request("gpu", "gpu.nvidia.com", 1)])
    by_kind: dict[str, list[dict[str, object]]] = {
        "ResourceSlice": nv.node_slices("n1", "H100", gpus=2)
        + nv.node_slices("n2", "A100", mode="static-mig"),
        "DeviceClass": list(nv.device_classes()),
        "ResourceClaim": [held, pending],
        "Node": [nv.node_object("n1", "H100", gpus=2), nv.node_object("n2", "A100")],
        "Pod": [nv.pod_object("team", "p", [("gpu", nv.from_claim("pending"))])],
    }
    mixed = [{**o, "kind": kind} for kind, objs in by_kind.items() for o in objs]
    kinds = {kind: [o for o in mixed if o["kind"] == kind] for kind in by_kind}
    fresh = FleetSnapshot.from_objects(mixed)
    listed = FleetSnapshot.from_kinds(
        kinds["ResourceSlice"], kinds["DeviceClass"], kinds["ResourceClaim"], kinds["Node"]
    )
    assert listed.slices == fresh.slices and len(listed.slices) == len(by_kind["ResourceSlice"])
    assert listed.classes == fresh.classes and len(listed.classes) == len(by_kind["DeviceClass"])
    assert [c["metadata"]["name"] for c in listed.allocated_claims] == ["held"]
    assert listed.allocated_claims == fresh.allocated_claims
    assert list(listed.nodes) == list(fresh.nodes) == ["n1", "n2"]
