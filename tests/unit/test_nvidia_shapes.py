"""Shape checks for simulator.nvidia: the objects must be what the API server would accept and what the
NVIDIA driver publishes (names, limits, counter references, MIG catalog arithmetic)."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from simulator import nvidia as nv

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MIG_NAME = re.compile(r"^gpu-(\d+)-mig-([a-z0-9-]+)-(\d+)-(\d+)$")
SLICE_NAME = re.compile(
    r"^[0-9a-f]+-(gpu|compute-domain)\.nvidia\.com-[a-z0-9.-]+-[bcdfghjklmnpqrstvwxz2456789]{5}$"
)
C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")

ALL_MODES: list[tuple[str, str, str | None]] = [(model, "full", None) for model in nv.MODELS] + [
    (model, mode, layout)
    for model in nv.MODELS
    for mode, layout in [
        ("static-mig", "all-1g"),
        ("static-mig", "balanced"),
        ("static-mig", "all-3g"),
        ("static-mig", "mixed"),
        ("dynamic-mig", None),
    ]
]


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def _check_slice_limits(s: dict[str, Any]) -> None:
    spec = s["spec"]
    devices = spec.get("devices", [])
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    limit = nv.MAX_DEVICES_PER_SLICE_ADVANCED if advanced else nv.MAX_DEVICES_PER_SLICE
    assert len(devices) <= limit
    # 1.35+: only one of devices / sharedCounters per slice.
    assert not (devices and spec.get("sharedCounters"))
    assert len(spec.get("sharedCounters", [])) <= nv.MAX_COUNTER_SETS_PER_SLICE
    for cs in spec.get("sharedCounters", []):
        assert DNS_LABEL.match(cs["name"])
        assert 0 < len(cs["counters"]) <= nv.MAX_COUNTERS_PER_SET
        assert all(DNS_LABEL.match(k) for k in cs["counters"])
    for d in devices:
        assert DNS_LABEL.match(d["name"]), d["name"]
        assert len(d["name"]) <= 63
        assert len(d["attributes"]) + len(d.get("capacity", {})) <= nv.MAX_ATTRIBUTES_AND_CAPACITIES
        for key, value in d["attributes"].items():
            ident = key.rsplit("/", 1)[-1]
            assert C_IDENT.match(ident), key
            assert len(value) == 1
            assert next(iter(value)) in ("string", "int", "bool", "version")
            if "string" in value:
                assert len(value["string"]) <= 64
        assert len(d.get("consumesCounters", [])) <= 2
        assert len(d.get("taints", [])) <= 16


@pytest.mark.parametrize(("model", "mode", "layout"), ALL_MODES)
def test_slices_respect_api_limits_and_name_formats(model: str, mode: str, layout: str | None) -> None:
    if mode != "full" and model == "A100" and mode == "dynamic-mig":
        pass  # Ampere in dynamic MIG publishes partitions only; still checked below
    slices = nv.node_slices("node-a1", model, mode=mode, layout=layout)
    names = [s["metadata"]["name"] for s in slices]
    assert len(set(names)) == len(names)
    for i, s in enumerate(slices):
        assert SLICE_NAME.match(s["metadata"]["name"]), s["metadata"]["name"]
        assert s["metadata"]["name"].startswith(f"{i:x}-gpu.nvidia.com-node-a1-")
        assert s["apiVersion"] == "resource.k8s.io/v1"
        assert s["spec"]["driver"] == "gpu.nvidia.com"
        assert s["spec"]["nodeName"] == "node-a1"
        assert s["spec"]["pool"] == {"name": "node-a1", "generation": 1, "resourceSliceCount": len(slices)}
        _check_slice_limits(s)
        dev_names = [d["name"] for d in s["spec"].get("devices", [])]
        assert dev_names == sorted(dev_names)
    all_names = [d["name"] for d in _devices(slices)]
    assert len(set(all_names)) == len(all_names), "device names must be unique in the pool"


def test_full_mode_publishes_eight_gpus_with_all_attributes() -> None:
    slices = nv.node_slices("b200-1", "B200")
    assert len(slices) == 1
    devs = slices[0]["spec"]["devices"]
    assert [d["name"] for d in devs] == [f"gpu-{i}" for i in range(8)]
    expected = {
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot",
    }
    for d in devs:
        assert set(d["attributes"]) == expected
        assert d["attributes"]["productName"] == {"string": "NVIDIA B200"}
        assert d["attributes"]["cudaComputeCapability"] == {"version": "10.0.0"}
        assert d["attributes"]["uuid"]["string"].startswith("GPU-")
        assert d["capacity"] == {"memory": {"value": nv.MODELS["B200"].memory_quantity}}
    assert len({d["attributes"]["uuid"]["string"] for d in devs}) == 8


def test_it_is_deterministic() -> None:
    assert nv.node_slices("n1", "H100", "dynamic-mig") == nv.node_slices("n1", "H100", "dynamic-mig")
    assert nv.node_slices("n1", "H100") != nv.node_slices("n2", "H100")
    assert nv.node_object("n1", "H100") == nv.node_object("n1", "H100")


@pytest.mark.parametrize("model", [m for m in nv.MODELS if nv.MODELS[m].mig_profiles])
def test_static_mig_names_attributes_and_slice_sums(model: str) -> None:
    m = nv.MODELS[model]
    for layout in [*nv.LAYOUTS, "mixed"]:
        devs = _devices(nv.node_slices("n", model, "static-mig", layout))
        per_gpu: dict[str, list[dict[str, Any]]] = {}
        for d in devs:
            match = MIG_NAME.match(d["name"])
            assert match, d["name"]
            attrs = d["attributes"]
            assert attrs["type"] == {"string": "mig"}
            assert attrs["uuid"]["string"].startswith("mig-")
            profile = m.profile(attrs["profile"]["string"])
            assert match.group(2) == profile.name_part
            assert int(match.group(3)) == profile.gi_profile_id
            assert int(match.group(4)) in profile.placements
            assert "consumesCounters" not in d
            slices = sorted(
                int(k.removeprefix("memorySlice")) for k in d["capacity"] if k.startswith("memorySlice")
            )
            start = int(match.group(4))
            assert slices == list(range(start, start + profile.memory_slices))
            per_gpu.setdefault(attrs["parentUUID"]["string"], []).append(d)
        for parent, mig_devs in per_gpu.items():
            profiles = [m.profile(d["attributes"]["profile"]["string"]) for d in mig_devs]
            assert sum(p.compute_slices for p in profiles) <= 7, (layout, parent)
            used = [k for d in mig_devs for k in d["capacity"] if k.startswith("memorySlice")]
            assert len(used) <= 8
            assert len(set(used)) == len(used), (layout, parent, "memory slices overlap")


def test_gpus_in_mig_mode_publish_only_mig_devices() -> None:
    devs = _devices(nv.node_slices("n", "H100", "static-mig", "all-1g"))
    assert len(devs) == 56
    assert all(d["attributes"]["type"]["string"] == "mig" for d in devs)
    mixed = _devices(nv.node_slices("n", "H100", "static-mig", "balanced,full"))
    assert {d["name"] for d in mixed if d["attributes"]["type"]["string"] == "gpu"} == {
        "gpu-1",
        "gpu-3",
        "gpu-5",
        "gpu-7",
    }


@pytest.mark.parametrize("model", [m for m in nv.MODELS if nv.MODELS[m].mig_profiles])
@pytest.mark.parametrize("split", [True, False])
def test_dynamic_mig_counter_sets_resolve(model: str, split: bool) -> None:
    slices = nv.node_slices("dyn-1", model, "dynamic-mig", split=split)
    sets = {cs["name"]: cs["counters"] for s in slices for cs in s["spec"].get("sharedCounters", [])}
    assert set(sets) == {f"gpu-{i}-counter-set" for i in range(8)}
    if split:
        assert "devices" not in slices[0]["spec"]
        assert len(slices) == 9
    else:
        assert len(slices) == 8
    for d in _devices(slices):
        assert len(d["consumesCounters"]) == 1
        for consumption in d["consumesCounters"]:
            assert consumption["counterSet"] in sets, "counter set reference must resolve in the pool"
            available = sets[consumption["counterSet"]]
            for counter, value in consumption["counters"].items():
                assert counter in available
                assert nv.parse_quantity(value["value"]) <= nv.parse_quantity(available[counter]["value"])
        if d["attributes"]["type"]["string"] == "mig":
            assert "uuid" not in d["attributes"]
            assert not any(k.startswith("memorySlice") for k in d["capacity"])


def test_dynamic_mig_device_counts_per_gpu() -> None:
    # Every profile x placement: 7 (1g) + 7 (1g+me) + 4 (1g 2x mem) + 3 (2g) + 2 (3g) + 1 (4g) + 1 (7g) = 25,
    # plus the full GPU on Hopper and newer; far below the 64-device limit, so one slice per GPU.
    per_gpu = [len(s["spec"]["devices"]) for s in nv.node_slices("d", "H100", "dynamic-mig")[1:]]
    assert per_gpu == [26] * 8
    ampere = [len(s["spec"]["devices"]) for s in nv.node_slices("d", "A100", "dynamic-mig")[1:]]
    assert ampere == [25] * 8


def test_more_than_eight_gpus_split_counter_slices() -> None:
    slices = nv.node_slices("big", "H100", "dynamic-mig", gpus=12)
    counter_slices = [s for s in slices if s["spec"].get("sharedCounters")]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8, 4]
    for s in slices:
        _check_slice_limits(s)


def test_taints_lower_the_device_limit() -> None:
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    slices = nv.node_slices("t", "H100", "static-mig", "all-1g", gpus=16, taints={3: [taint]})
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 48]
    tainted = [d for d in _devices(slices) if d.get("taints")]
    assert len(tainted) == 7
    assert all(d["name"].startswith("gpu-3-") for d in tainted)
    for s in slices:
        _check_slice_limits(s)
        assert s["spec"]["pool"]["resourceSliceCount"] == 2


def _valid_layouts(model: nv.GpuModel) -> list[list[tuple[nv.MigProfile, int]]]:
    """Every set of MIG instances NVML allows: disjoint memory slices, <= 7 compute slices, max counts."""
    options = [(p, s) for p in model.mig_profiles for s in p.placements]
    result: list[list[tuple[nv.MigProfile, int]]] = []

    def rec(i: int, chosen: list[tuple[nv.MigProfile, int]], used: set[int], g: int) -> None:
        if i == len(options):
            result.append(list(chosen))
            return
        p, s = options[i]
        span = set(range(s, s + p.memory_slices))
        count = sum(1 for q, _ in chosen if q is p)
        if not span & used and g + p.compute_slices <= 7 and count < p.max_count:
            rec(i + 1, [*chosen, (p, s)], used | span, g + p.compute_slices)
        rec(i + 1, chosen, used, g)

    rec(0, [], set(), 0)
    return result


@pytest.mark.parametrize("model", [m for m in nv.MODELS if nv.MODELS[m].mig_profiles])
def test_catalog_counts_and_counter_budget(model: str) -> None:
    m = nv.MODELS[model]
    assert [p.max_count for p in m.mig_profiles] == [7, 1, 4, 3, 2, 1, 1]
    for p in m.mig_profiles:
        assert p.compute_slices <= 7
        assert p.memory_slices <= 8
        assert re.match(r"^\dg\.\d+gb(\+me)?$", p.name)
        # Placements fit inside the 8 memory slices.
        assert all(s + p.memory_slices <= m.memory_slices for s in p.placements)
        assert p.memory_mib <= m.memory_mib
    # Any combination NVML could create must fit the full-GPU counters the dynamic layout publishes.
    budget = m.max_capacities()
    for layout in _valid_layouts(m):
        totals = {k: sum(p.capacities()[k] for p, _ in layout) for k in budget}
        over = {k for k in budget if totals[k] > budget[k]}
        assert not over, (model, [(p.name, s) for p, s in layout], over)
    # The max-count column is reachable: n instances of a profile fit side by side.
    for p in m.mig_profiles:
        placed: list[int] = []
        for s in p.placements:
            if all(abs(s - t) >= p.memory_slices for t in placed):
                placed.append(s)
        if p.kind != "1g+me":
            assert len(placed) >= p.max_count, p.name


def test_mig_catalog_names_match_reference_table() -> None:
    assert [p.name for p in nv.MODELS["B200"].mig_profiles] == [
        "1g.23gb",
        "1g.23gb+me",
        "1g.45gb",
        "2g.45gb",
        "3g.90gb",
        "4g.90gb",
        "7g.180gb",
    ]
    assert nv.MODELS["H100"].profile("1g+me").name_part == "1g10gb-me"
    assert nv.mig_device_name(0, nv.MODELS["H100"].profile("1g"), 0) == "gpu-0-mig-1g10gb-19-0"
    assert nv.mig_device_name(1, nv.MODELS["GB200"].profile("2g"), 0) == "gpu-1-mig-2g47gb-14-0"


def test_itertools_layout_enumeration_is_nontrivial() -> None:
    layouts = _valid_layouts(nv.MODELS["H100"])
    assert len(layouts) > 50
    assert any(len(lay) == 7 for lay in layouts)
    assert list(itertools.islice(layouts, 1))


def test_device_classes_have_the_helm_selectors() -> None:
    classes = {c["metadata"]["name"]: c for c in nv.device_classes()}
    assert set(classes) == {
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "vfio.gpu.nvidia.com",
        "compute-domain-default-channel.nvidia.com",
        "compute-domain-daemon.nvidia.com",
    }
    gpu = classes["gpu.nvidia.com"]["spec"]
    assert gpu["extendedResourceName"] == "nvidia.com/gpu"
    assert gpu["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.nvidia.com' && "
                "device.attributes['gpu.nvidia.com'].type == 'gpu'"
            }
        }
    ]
    channel = classes["compute-domain-default-channel.nvidia.com"]["spec"]["selectors"][0]["cel"][
        "expression"
    ]
    assert channel.endswith("device.attributes['compute-domain.nvidia.com'].id == 0")
    assert all("extendedResourceName" not in c["spec"] for n, c in classes.items() if n != "gpu.nvidia.com")


def test_compute_domain_slice() -> None:
    s = nv.compute_domain_slice("b200-1")
    assert s["spec"]["driver"] == "compute-domain.nvidia.com"
    assert s["spec"]["pool"] == {"name": "b200-1", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in s["spec"]["devices"]] == ["channel-0", "daemon-0"]
    assert s["spec"]["devices"][0]["attributes"] == {"type": {"string": "channel"}, "id": {"int": 0}}
    assert SLICE_NAME.match(s["metadata"]["name"])


def test_node_object_labels() -> None:
    node = nv.node_object("gb200-rack1-n3", "GB200", clique="cluster-a.1")
    labels = node["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "gb200-rack1-n3"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.clique"] == "cluster-a.1"
    assert labels["kubernetes.io/arch"] == "arm64"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert {"cpu", "memory", "pods"} <= set(node["status"]["allocatable"])
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert node["metadata"]["uid"] == nv.node_uid("gb200-rack1-n3")
    assert "nvidia.com/gpu.clique" not in nv.node_object("x", "B200")["metadata"]["labels"]


def test_claim_pod_allocation_and_event_helpers() -> None:
    tmpl = nv.claim_template("ml", "one-gpu", [nv.exactly_request("gpu", "gpu.nvidia.com")])
    assert tmpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    pod = nv.pod_object("ml", "train-0", [("gpu", "one-gpu")], node="b200-1")
    claim_name = nv.generated_claim_name("train-0", "gpu")
    assert claim_name.startswith("train-0-gpu-")
    status = nv.allocation_status([{"request": "gpu", "device": "gpu-3"}], "b200-1", reserved_for=[pod])
    claim = nv.claim_object(
        "ml",
        claim_name,
        [nv.exactly_request("gpu", "gpu.nvidia.com")],
        status=status,
        owner_pod=pod,
        pod_claim_name="gpu",
    )
    assert claim["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "b200-1", "device": "gpu-3"}
    ]
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b200-1"]}]}]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "train-0", "uid": pod["metadata"]["uid"]}
    ]
    assert claim["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "gpu"}
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    direct = nv.pod_object("ml", "p2", [("gpu", nv.from_claim("shared"))])
    assert direct["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "shared"}]
    assert direct["status"]["phase"] == "Pending"

    msg = nv.fit_error_message(6, {nv.CANNOT_ALLOCATE: 6})
    assert msg == (
        "0/6 nodes are available: 6 cannot allocate all claims. still not schedulable, preemption: "
        "0/6 nodes are available: 6 Preemption is not helpful for scheduling."
    )
    ev = nv.failed_scheduling_event(direct, msg, count=4, first_timestamp="2026-03-06T19:00:00Z")
    assert (ev["reason"], ev["count"], ev["type"]) == ("FailedScheduling", 4, "Warning")
    assert ev["involvedObject"]["uid"] == direct["metadata"]["uid"]
    assert ev["metadata"]["name"].startswith("p2.")
    fc = nv.failed_claim_creation_event(direct, "gpu", 'resource claim template "x": not found')
    assert fc["message"] == 'PodResourceClaim gpu: resource claim template "x": not found'


def test_generated_claim_prefix_truncates_long_names() -> None:
    prefix = nv.generated_claim_prefix("p" * 60, "c" * 20)
    assert len(prefix) == 57 + 2
    assert nv.generated_claim_prefix("short", "gpu") == "short-gpu-"


def test_quantity_round_trip() -> None:
    for v in [0, 1, 16, 1023, 1024, 1536, 80 * 2**30, 81559 * 2**20, 2**60 * 3]:
        assert nv.parse_quantity(nv.binary_quantity(v)) == v
    assert nv.binary_quantity(81559 * 2**20) == "81559Mi"
    assert nv.binary_quantity(80 * 2**30) == "80Gi"
    assert nv.parse_quantity("4k") == 4000


@pytest.mark.parametrize(
    ("product", "family"),
    [
        ("NVIDIA B200", "B200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA GB300", "GB300"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("Tesla T4", "other"),
    ],
)
def test_model_family(product: str, family: str) -> None:
    assert nv.model_family(product) == family
