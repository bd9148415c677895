"""Cluster-scoped Kubernetes objects: ResourceSlices of a node, the ComputeDomain slice, DeviceClasses
and Nodes.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from simulator.nvidia.constants import (
    CD_DRIVER,
    DEFAULT_CREATED,
    DRIVER_VERSION,
    GPU_DRIVER,
    KUBELET_VERSION,
    MAX_COUNTER_SETS_PER_SLICE,
    RESOURCE_API,
    Obj,
    name_suffix,
    node_uid,
    stable_uid,
)
from simulator.nvidia.devices import _chunks, _s, counter_set, gpu_device, mig_device
from simulator.nvidia.models import LAYOUTS, MODELS, layout_for_gpu


def _meta(
    kind: str, name: str, namespace: str | None = None, created: str | None = None, uid: str | None = None
) -> Obj:
    meta: Obj = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["uid"] = uid or stable_uid(kind, namespace or "", name)
    meta["creationTimestamp"] = created or DEFAULT_CREATED
    return meta


def slice_name(index: int, driver: str, node: str) -> str:
    """1.36 helper naming: GenerateName `<hex index>-<driver>-<owner>-` plus a (here deterministic) suffix."""
    return f"{index:x}-{driver}-{node}-{name_suffix('slice', driver, node, index)}"


def _slice(
    node: str,
    driver: str,
    index: int,
    generation: int,
    count: int,
    devices: list[Obj] | None = None,
    counters: list[Obj] | None = None,
    created: str | None = None,
) -> Obj:
    name = slice_name(index, driver, node)
    meta = _meta("ResourceSlice", name, created=created)
    meta["generateName"] = f"{index:x}-{driver}-{node}-"
    # The kubelet plugin helper makes the Node the controller owner, so slices vanish with their node.
    meta["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid(node), "controller": True}
    ]
    spec: Obj = {
        "driver": driver,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
        "nodeName": node,
    }
    if counters is not None:
        spec["sharedCounters"] = counters
    if devices is not None:
        spec["devices"] = devices
    return {"apiVersion": RESOURCE_API, "kind": "ResourceSlice", "metadata": meta, "spec": spec}


def node_slices(
    node: str,
    model: str,
    mode: str = "full",
    layout: str | None = None,
    gpus: int = 8,
    generation: int = 1,
    split: bool = True,
    taints: dict[int, list[dict[str, Any]]] | None = None,
    created: str | None = None,
) -> list[Obj]:
    """All gpu.nvidia.com ResourceSlices of one node's pool (pool name = node name).

    mode: "full" (one slice, full GPUs), "static-mig" (MIG devices per `layout`, see LAYOUTS / "mixed" /
    comma list; GPUs in MIG mode publish only their MIG devices) or "dynamic-mig" (partitionable layout;
    with `split` the ≥1.35 form: counters-only slice(s) first, then devices-only slices per GPU; without
    it the <1.35 form with counters and devices per GPU slice). `taints` maps a GPU index to taint dicts
    applied to every device derived from that GPU.
    Preconditions: `model` is a MODELS key; MIG modes need a model with a MIG catalog; 1 <= gpus.
    """
    m = MODELS[model]
    taints = taints or {}
    if mode not in ("full", "static-mig", "dynamic-mig"):
        raise ValueError(f"unknown mode {mode!r}")
    if mode != "full" and not m.mig_profiles:
        raise ValueError(f"{model} has no MIG catalog")

    def taint(index: int, devs: list[Obj]) -> list[Obj]:
        if taints.get(index):
            for d in devs:
                d["taints"] = [dict(t) for t in taints[index]]
        return devs

    groups: list[tuple[list[Obj] | None, list[Obj] | None]] = []  # (counters, devices) per slice
    if mode == "full":
        devs = [d for i in range(gpus) for d in taint(i, [gpu_device(node, m, i)])]
        groups = [(None, chunk) for chunk in _chunks(sorted(devs, key=lambda d: d["name"]))]
    elif mode == "static-mig":
        devs = []
        for i in range(gpus):
            lay = layout_for_gpu(layout, i)
            if lay == "full":  # MIG disabled on this GPU: it publishes itself
                devs += taint(i, [gpu_device(node, m, i)])
                continue
            devs += taint(i, [mig_device(node, m, i, m.profile(k), s, False) for k, s in LAYOUTS[lay]])
        groups = [(None, chunk) for chunk in _chunks(sorted(devs, key=lambda d: d["name"]))]
    else:
        per_gpu: list[tuple[int, list[Obj]]] = []
        for i in range(gpus):
            # Ampere cannot toggle MIG without a reset: with MIG on it advertises only partitions.
            devs = [] if m.architecture == "Ampere" else [gpu_device(node, m, i, dynamic=True)]
            devs += [mig_device(node, m, i, p, s, True) for p in m.mig_profiles for s in p.placements]
            per_gpu.append((i, taint(i, sorted(devs, key=lambda d: d["name"]))))
        if split:
            sets = [counter_set(m, i) for i in range(gpus)]
            for j in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE):
                groups.append((sets[j : j + MAX_COUNTER_SETS_PER_SLICE], None))
            for _, devs in per_gpu:
                groups += [(None, chunk) for chunk in _chunks(devs)]
        else:
            # <1.35: counter sets were per slice, so each GPU's set travels with that GPU's devices.
            for i, devs in per_gpu:
                chunks = _chunks(devs)
                if len(chunks) > 1:
                    raise ValueError("combined (<1.35) slices cannot split a GPU's devices")
                groups.append(([counter_set(m, i)], chunks[0]))
    return [
        _slice(node, GPU_DRIVER, idx, generation, len(groups), devices=devs, counters=ctrs, created=created)
        for idx, (ctrs, devs) in enumerate(groups)
    ]


def compute_domain_slice(node: str, generation: int = 1, created: str | None = None) -> Obj:
    """The compute-domain.nvidia.com slice of a node: `channel-0` (type channel, id 0) and `daemon-0`."""
    devices = [
        {"name": "channel-0", "attributes": {"type": _s("channel"), "id": {"int": 0}}},
        {"name": "daemon-0", "attributes": {"type": _s("daemon"), "id": {"int": 0}}},
    ]
    return _slice(node, CD_DRIVER, 0, generation, 1, devices=devices, created=created)


_CLASS_SELECTORS: Final = {
    "gpu.nvidia.com": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    ),
    "mig.nvidia.com": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    ),
    "vfio.gpu.nvidia.com": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'"
    ),
    "compute-domain-default-channel.nvidia.com": (
        "device.driver == 'compute-domain.nvidia.com' && "
        "device.attributes['compute-domain.nvidia.com'].type == 'channel' && "
        "device.attributes['compute-domain.nvidia.com'].id == 0"
    ),
    "compute-domain-daemon.nvidia.com": (
        "device.driver == 'compute-domain.nvidia.com' && "
        "device.attributes['compute-domain.nvidia.com'].type == 'daemon'"
    ),
}


def device_classes(created: str | None = None) -> list[Obj]:
    """The DeviceClasses the driver's Helm chart installs for resource.k8s.io/v1
    (`deployments/helm/dra-driver-nvidia-gpu/` in kubernetes-sigs/dra-driver-nvidia-gpu)."""
    out = []
    for name, expr in _CLASS_SELECTORS.items():
        meta = _meta("DeviceClass", name, created=created)
        meta["labels"] = {"app.kubernetes.io/managed-by": "Helm"}
        spec: Obj = {"selectors": [{"cel": {"expression": expr}}]}
        if name == "gpu.nvidia.com":
            spec["extendedResourceName"] = "nvidia.com/gpu"
        out.append({"apiVersion": RESOURCE_API, "kind": "DeviceClass", "metadata": meta, "spec": spec})
    return out


def device_taint_rule(
    name: str,
    taint: Obj,
    driver: str | None = None,
    pool: str | None = None,
    device: str | None = None,
    selector: bool = True,
    created: str | None = None,
) -> Obj:
    """A DeviceTaintRule (``resource.k8s.io/v1``, as an admin or a health controller writes it): ``taint``
    for the devices of ``driver``/``pool``/``device`` (any where None; none at all without ``selector``)."""
    spec: Obj = {"taint": taint}
    if selector:
        given = {"driver": driver, "pool": pool, "device": device}
        spec["deviceSelector"] = {k: v for k, v in given.items() if v is not None}
    meta = _meta("DeviceTaintRule", name, created=created)
    return {"apiVersion": RESOURCE_API, "kind": "DeviceTaintRule", "metadata": meta, "spec": spec}


def node_object(
    name: str,
    model: str,
    clique: str | None = None,
    labels: dict[str, str] | None = None,
    gpus: int = 8,
    created: str | None = None,
    ready: bool = True,
) -> Obj:
    """A GPU Node as kubelet + GPU feature discovery label it (no nvidia.com/gpu in allocatable: DRA only)."""
    m = MODELS[model]
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": m.cpu_arch,
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": m.cpu_arch,
        "node.kubernetes.io/instance-type": f"gpu-{m.key.lower()}-{gpus}x",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": m.gfd_product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(m.memory_mib),
        "nvidia.com/gpu.family": m.family_label,
        "nvidia.com/cuda.driver-version.full": DRIVER_VERSION,
    }
    if clique:
        node_labels["nvidia.com/gpu.clique"] = clique
    node_labels.update(labels or {})
    meta = _meta("Node", name, created=created, uid=node_uid(name))
    meta["labels"] = node_labels
    meta["annotations"] = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    }
    # Host sizes of typical 8-GPU servers; the kubelet reserves a little, hence allocatable < capacity.
    cpu, mem_gi = (144, 1800) if m.cpu_arch == "arm64" else (224, 2015)
    capacity = {
        "cpu": str(cpu),
        "memory": f"{mem_gi * 1024 * 1024}Ki",
        "pods": "110",
        "ephemeral-storage": "3750Gi",
    }
    allocatable = {
        "cpu": f"{cpu * 1000 - 2000}m",
        "memory": f"{(mem_gi - 16) * 1024 * 1024}Ki",
        "pods": "110",
        "ephemeral-storage": "3500Gi",
    }
    octets = hashlib.sha256(name.encode()).digest()
    ip = f"10.{64 + octets[0] % 64}.{octets[1]}.{octets[2] % 254 + 1}"
    ts = created or DEFAULT_CREATED
    conditions = [
        _cond("MemoryPressure", "False", "KubeletHasSufficientMemory", ts),
        _cond("DiskPressure", "False", "KubeletHasNoDiskPressure", ts),
        _cond("PIDPressure", "False", "KubeletHasSufficientPID", ts),
        _cond("Ready", "True" if ready else "Unknown", "KubeletReady" if ready else "NodeStatusUnknown", ts),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": {"providerID": f"sim://{name}"},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": m.cpu_arch,
                "kubeletVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04.2 LTS",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kernelVersion": "6.8.0-85-generic",
            },
        },
    }


def _cond(ctype: str, status: str, reason: str, ts: str, message: str = "") -> Obj:
    c: Obj = {"type": ctype, "status": status, "reason": reason, "lastTransitionTime": ts}
    if ctype in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready"):
        c["lastHeartbeatTime"] = ts
    if message:
        c["message"] = message
    return c
