"""What the real kube-scheduler (v1.37.2) does with typical GPU claims on a simulated NVIDIA fleet.

These tests pin the behaviour claimscope's diagnosis engine replays: which devices the structured
allocator picks, what it writes into ``status.allocation``, and the exact messages users see when
a claim cannot be allocated or is written the "naive" way. Observations are recorded in FINDINGS.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from simulator import nvidia
from tests.controlplane.kube import ApiError, Kube, Obj, wait_for
from tests.controlplane.nodes import for_create
from tests.controlplane.publisher import FleetPublisher

pytestmark = pytest.mark.controlplane

GPU = "device.attributes['gpu.nvidia.com']"
CANNOT_ALLOCATE = "cannot allocate all claims"


def unschedulable_message(nodes: int) -> str:
    """The exact PodScheduled message when no node can allocate the pod's claims (v1.37.2)."""
    return (
        f"0/{nodes} nodes are available: {nodes} {CANNOT_ALLOCATE}. "
        f"preemption: 0/{nodes} nodes are available: {nodes} Preemption is not helpful for scheduling."
    )


# -- helpers -------------------------------------------------------------------------------------


class Fleet:
    """The published fleet: device dicts by (pool, device name) so tests can assert what was picked."""

    def __init__(self, kube: Kube) -> None:
        self.publisher = FleetPublisher(kube)
        self.publisher.device_classes()
        self.devices: dict[tuple[str, str], Obj] = {}

    def node(self, name: str, model: str, **kwargs: Any) -> None:
        for s in self.publisher.gpu_node(name, model, **kwargs):
            for dev in s["spec"].get("devices", []):
                self.devices[(s["spec"]["pool"]["name"], dev["name"])] = dev

    def attr(self, pool: str, device: str, name: str) -> Any:
        value = self.devices[(pool, device)]["attributes"][name]
        return next(iter(value.values()))


def create_template(
    kube: Kube, ns: str, name: str, requests: list[Obj], constraints: list[Obj] | None = None
) -> Obj:
    return kube.create(for_create(nvidia.claim_template(ns, name, requests, constraints)))


def create_pod(kube: Kube, ns: str, name: str, template: str) -> Obj:
    return kube.create(for_create(nvidia.pod_object(ns, name, [("gpus", template)])))


def scheduled_condition(pod: Obj) -> Obj | None:
    conds = pod.get("status", {}).get("conditions", [])
    return next((c for c in conds if c["type"] == "PodScheduled"), None)


def wait_bound(kube: Kube, ns: str, name: str) -> Obj:
    """Waits until the scheduler bound the pod; returns the pod."""

    def bound() -> Obj | None:
        pod = kube.get("Pod", name, ns)
        cond = scheduled_condition(pod)
        if cond and cond["status"] == "False" and cond.get("reason") == "SchedulerError":
            raise AssertionError(f"pod {name}: {cond['message']}")
        return pod if pod["spec"].get("nodeName") else None

    return wait_for(f"pod {ns}/{name} to be bound", bound, timeout=60)


def wait_not_scheduled(kube: Kube, ns: str, name: str, reason: str = "Unschedulable") -> str:
    """Waits for PodScheduled=False with ``reason``; returns the condition message."""

    def failed() -> str | None:
        pod = kube.get("Pod", name, ns)
        assert not pod["spec"].get("nodeName"), f"pod {name} was unexpectedly bound"
        cond = scheduled_condition(pod)
        if cond and cond["status"] == "False" and cond.get("reason") == reason:
            return str(cond["message"])
        return None

    return wait_for(f"pod {ns}/{name} PodScheduled=False/{reason}", failed, timeout=60)


def claim_of(kube: Kube, pod: Obj) -> Obj:
    """The claim generated for the pod's (single) template claim."""
    statuses = pod["status"]["resourceClaimStatuses"]
    return kube.get("ResourceClaim", statuses[0]["resourceClaimName"], pod["metadata"]["namespace"])


def results(claim: Obj) -> list[Obj]:
    return list(claim["status"]["allocation"]["devices"]["results"])


def assert_allocated_to(claim: Obj, pod: Obj) -> None:
    """status.allocation pins the claim to the pod's node, and the claim is reserved for the pod."""
    alloc = claim["status"]["allocation"]
    node = pod["spec"]["nodeName"]
    terms = alloc["nodeSelector"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    assert all(r["pool"] == node and r["driver"] == "gpu.nvidia.com" for r in results(claim))
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]


# -- the correct forms ---------------------------------------------------------------------------


def test_h100_or_better_with_40gi_gets_full_hopper_or_blackwell_gpus_until_exhausted(
    kube: Kube, namespace: str
) -> None:
    fleet = Fleet(kube)
    fleet.node("a100-0", "A100", gpus=2)  # Ampere: excluded by the compute-capability selector
    fleet.node("h100-0", "H100", gpus=2)
    fleet.node("b200-0", "B200", gpus=2)
    create_template(
        kube,
        namespace,
        "big-gpu",
        [
            nvidia.exactly_request(
                "gpu",
                "gpu.nvidia.com",
                selectors=[
                    # "H100 or better": Hopper is compute capability 9.0; semver, not a string compare.
                    f"{GPU}.cudaComputeCapability.compareTo(semver('9.0.0')) >= 0",
                    # memory is a capacity (a Quantity), so it is compared with compareTo, not >=.
                    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
                ],
            )
        ],
    )

    picked = set()
    for i in range(4):
        pod = wait_bound(
            kube, namespace, create_pod(kube, namespace, f"train-{i}", "big-gpu")["metadata"]["name"]
        )
        claim = claim_of(kube, pod)
        assert_allocated_to(claim, pod)
        [result] = results(claim)
        assert result["request"] == "gpu"
        assert fleet.attr(result["pool"], result["device"], "type") == "gpu"
        picked.add((result["pool"], result["device"]))
    assert picked == {(n, f"gpu-{i}") for n in ("h100-0", "b200-0") for i in range(2)}

    create_pod(kube, namespace, "train-4", "big-gpu")
    assert wait_not_scheduled(kube, namespace, "train-4") == unschedulable_message(3)


def test_mig_small_else_medium_else_full_gpu_follows_first_available_order(
    kube: Kube, namespace: str
) -> None:
    fleet = Fleet(kube)
    # One H100 in the mig-parted "balanced" layout: 2x 1g.10gb, 1x 2g.20gb, 1x 3g.40gb.
    fleet.node("mig-0", "H100", mode="static-mig", layout="balanced", gpus=1)
    fleet.node("full-0", "H100", gpus=1)
    profile = f"{GPU}.profile"
    create_template(
        kube,
        namespace,
        "mig-or-gpu",
        [
            nvidia.first_available_request(
                "gpu",
                [
                    nvidia.subrequest("small", "mig.nvidia.com", selectors=[f"{profile}.startsWith('1g.')"]),
                    nvidia.subrequest(
                        "medium",
                        "mig.nvidia.com",
                        selectors=[f"{profile}.startsWith('2g.') || {profile}.startsWith('3g.')"],
                    ),
                    nvidia.subrequest("full", "gpu.nvidia.com"),
                ],
            )
        ],
    )

    chosen = []
    for i in range(5):
        pod = wait_bound(
            kube, namespace, create_pod(kube, namespace, f"job-{i}", "mig-or-gpu")["metadata"]["name"]
        )
        claim = claim_of(kube, pod)
        assert_allocated_to(claim, pod)
        [result] = results(claim)
        kind = fleet.attr(result["pool"], result["device"], "type")
        label = fleet.attr(result["pool"], result["device"], "profile") if kind == "mig" else "full"
        chosen.append((result["request"], label))
    assert chosen == [
        ("gpu/small", "1g.10gb"),
        ("gpu/small", "1g.10gb"),
        ("gpu/medium", "2g.20gb"),
        ("gpu/medium", "3g.40gb"),
        ("gpu/full", "full"),
    ]

    create_pod(kube, namespace, "job-5", "mig-or-gpu")
    assert wait_not_scheduled(kube, namespace, "job-5") == unschedulable_message(2)


def test_four_gpus_on_one_nvlink_domain(kube: Kube, namespace: str) -> None:
    """The NVIDIA driver publishes no per-GPU NVLink/clique attribute (the clique is a node label),
    and a claim's devices come from one node's pool anyway. ``pcieRoot`` is a real per-GPU
    attribute but groups 2 GPUs on an HGX board, so it cannot stand in for the NVLink domain."""
    fleet = Fleet(kube)
    for n in ("hgx-0", "hgx-1"):
        fleet.node(n, "H100", gpus=4, clique="fabric-1.0")

    for name, count, attribute in [
        ("four-same-root", 4, "resource.kubernetes.io/pcieRoot"),
        ("four-same-model", 4, "gpu.nvidia.com/productName"),
        ("two-same-root", 2, "resource.kubernetes.io/pcieRoot"),
    ]:
        request = nvidia.exactly_request("gpus", "gpu.nvidia.com", count=count)
        create_template(kube, namespace, name, [request], [{"matchAttribute": attribute}])

    # No node has 4 GPUs under one PCIe root.
    create_pod(kube, namespace, "root-4", "four-same-root")
    assert wait_not_scheduled(kube, namespace, "root-4") == unschedulable_message(2)
    kube.request("DELETE", kube.path("Pod", "root-4", namespace), query={"gracePeriodSeconds": "0"})

    pod = wait_bound(
        kube, namespace, create_pod(kube, namespace, "nvl-4", "four-same-model")["metadata"]["name"]
    )
    claim = claim_of(kube, pod)
    assert_allocated_to(claim, pod)
    assert sorted(r["device"] for r in results(claim)) == [f"gpu-{i}" for i in range(4)]
    busy = pod["spec"]["nodeName"]

    for i in range(2):
        pod = wait_bound(
            kube, namespace, create_pod(kube, namespace, f"pair-{i}", "two-same-root")["metadata"]["name"]
        )
        claim = claim_of(kube, pod)
        assert_allocated_to(claim, pod)
        assert pod["spec"]["nodeName"] != busy
        roots = {
            fleet.attr(r["pool"], r["device"], "resource.kubernetes.io/pcieRoot") for r in results(claim)
        }
        assert len(results(claim)) == 2 and len(roots) == 1

    create_pod(kube, namespace, "nvl-4-more", "four-same-model")
    assert f"0/2 nodes are available: 2 {CANNOT_ALLOCATE}." in wait_not_scheduled(
        kube, namespace, "nvl-4-more"
    )


# -- the naive forms -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "operand_types"),
    [
        # memory is a capacity, not an attribute; attributes are typed `any` in the CEL env
        # An attribute is `dyn` with DRAListTypeAttributes on (the launcher's gates), `any` with it off.
        ('device.attributes["gpu.nvidia.com"].memory >= quantity("40Gi")', "(dyn, kubernetes.Quantity)"),
        # the right map, but Quantity has no ordering operators, only compareTo/isGreaterThan/...
        (
            'device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")',
            "(kubernetes.Quantity, kubernetes.Quantity)",
        ),
    ],
    ids=["attributes", "capacity"],
)
def test_quantity_compared_with_ge_is_rejected_at_create(
    kube: Kube, namespace: str, selector: str, operand_types: str
) -> None:
    request = nvidia.exactly_request("gpu", "gpu.nvidia.com", selectors=[selector])
    with pytest.raises(ApiError) as err:
        create_template(kube, namespace, "naive-mem", [request])
    assert err.value.code == 422
    assert (
        "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value: "
        in err.value.message
    )
    assert "compilation failed: ERROR: <input>:1:" in err.value.message
    assert f"found no matching overload for '_>=_' applied to '{operand_types}'" in err.value.message


def test_single_in_selector_has_no_preference_order(kube: Kube, namespace: str) -> None:
    fleet = Fleet(kube)
    fleet.node("mig-0", "H100", mode="static-mig", layout="balanced", gpus=1)
    # Written as "2g.20gb preferred, else 1g.10gb"; CEL `in` is a set test, so the order means nothing.
    create_template(
        kube,
        namespace,
        "naive-mig",
        [
            nvidia.exactly_request(
                "gpu", "mig.nvidia.com", selectors=[f"{GPU}.profile in ['2g.20gb', '1g.10gb']"]
            )
        ],
    )
    got = []
    for i in range(3):
        pod = wait_bound(
            kube, namespace, create_pod(kube, namespace, f"m-{i}", "naive-mig")["metadata"]["name"]
        )
        [r] = results(claim_of(kube, pod))
        got.append(fleet.attr(r["pool"], r["device"], "profile"))
    # Device-name order (1g sorts before 2g), not the order written in the list.
    assert got == ["1g.10gb", "1g.10gb", "2g.20gb"]
    # And nothing can say "else a full GPU": one request has one device class. The free 3g.40gb
    # slice does not match either, so the next pod is simply unschedulable.
    create_pod(kube, namespace, "m-3", "naive-mig")
    assert wait_not_scheduled(kube, namespace, "m-3") == unschedulable_message(1)


def test_profile_selector_on_full_gpus_is_a_scheduler_error(kube: Kube, namespace: str) -> None:
    Fleet(kube).node("full-0", "H100", gpus=1)
    create_template(
        kube,
        namespace,
        "naive-profile",
        [
            nvidia.exactly_request(
                "gpu", "gpu.nvidia.com", selectors=[f"{GPU}.profile in ['1g.10gb', '2g.20gb']"]
            )
        ],
    )
    create_pod(kube, namespace, "p-0", "naive-profile")
    # Full GPUs have no `profile` attribute: a runtime error aborts the whole scheduling attempt
    # (reason SchedulerError, not Unschedulable), it does not just "not match".
    message = wait_not_scheduled(kube, namespace, "p-0", reason="SchedulerError")
    claim = claim_of(kube, kube.get("Pod", "p-0", namespace))["metadata"]["name"]
    assert message == (
        f'running "DynamicResources" filter plugin: claim {namespace}/{claim}: selector #0 on device '
        "gpu.nvidia.com/full-0/gpu-0: CEL runtime error: no such key: profile. consider using CEL "
        "optional chaining (.? followed by orValue()) or guarding the check with has() for optional fields"
    )
