"""Device names, attributes and capacities as the driver publishes them: full GPUs, static and dynamic
MIG devices, counter sets, and how many devices fit in one ResourceSlice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from simulator.nvidia.constants import (
    CUDA_DRIVER_VERSION,
    DRIVER_VERSION,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_ADVANCED,
    Obj,
    binary_quantity,
    gpu_uuid,
    mig_uuid,
)
from simulator.nvidia.models import GpuModel, MigProfile, _rfc1123


def camel_to_dns(name: str) -> str:
    """`camelToDNSName` from the driver: copyEngines -> copy-engines."""
    out = []
    for i, c in enumerate(name):
        if c.isupper() and i > 0 and (name[i - 1].islower() or name[i - 1].isdigit()):
            out.append("-")
        out.append(c.lower())
    return _rfc1123("".join(out))


def mig_device_name(minor: int, profile: MigProfile, start: int) -> str:
    """`gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>` (mig.go ToCanonicalName)."""
    return f"gpu-{minor}-mig-{profile.name_part}-{profile.gi_profile_id}-{start}"


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


# HGX baseboards enumerate 8 GPUs at these PCI buses; pairs of GPUs hang off one PCIe switch/root port,
# which is what the `pcieRoot` attribute groups (SYNTHETIC but shaped like real HGX H100 topologies).
_PCI_BUSES: Final = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
_PCIE_ROOTS: Final = ("pci0000:15", "pci0000:37", "pci0000:97", "pci0000:b7")


def pci_bus_id(index: int) -> str:
    if index < len(_PCI_BUSES):
        return f"0000:{_PCI_BUSES[index]}:00.0"
    return f"0000:{0xE0 + index:02x}:00.0"


def pcie_root(index: int) -> str:
    return _PCIE_ROOTS[(index // 2) % len(_PCIE_ROOTS)] if index < 8 else f"pci0000:{0xC0 + index // 2:02x}"


def _s(v: str) -> dict[str, str]:
    return {"string": v}


def _v(v: str) -> dict[str, str]:
    return {"version": v}


def _cap(v: int) -> dict[str, str]:
    return {"value": binary_quantity(v)}


def _common_attrs(model: GpuModel, node: str, index: int) -> Obj:
    """Attributes every GPU-derived device shares (GpuInfo.Attributes / CommonAttributesMig)."""
    return {
        "productName": _s(model.product_name),
        "brand": _s("Nvidia"),
        "architecture": _s(model.architecture),
        "cudaComputeCapability": _v(model.cuda_compute_capability),
        "driverVersion": _v(DRIVER_VERSION),
        "cudaDriverVersion": _v(CUDA_DRIVER_VERSION),
        "resource.kubernetes.io/pciBusID": _s(pci_bus_id(index)),
        "resource.kubernetes.io/pcieRoot": _s(pcie_root(index)),
    }


def gpu_device(node: str, model: GpuModel, index: int, dynamic: bool = False) -> Obj:
    """The full-GPU device `gpu-<index>`; with `dynamic` the DynamicMIG form (max capacities + counters)."""
    attrs = {"type": _s("gpu"), "uuid": _s(gpu_uuid(node, index)), **_common_attrs(model, node, index)}
    dev: Obj = {"name": f"gpu-{index}", "attributes": attrs}
    if dynamic and model.mig_profiles:
        dev["capacity"] = {k: _cap(v) for k, v in model.max_capacities().items()}
        dev["consumesCounters"] = [{"counterSet": counter_set_name(index), "counters": _full_counters(model)}]
    else:
        dev["capacity"] = {"memory": _cap(model.memory_bytes)}
    return dev


def _counter_values(caps: Mapping[str, int], start: int, size: int) -> dict[str, dict[str, str]]:
    counters = {camel_to_dns(k): _cap(v) for k, v in caps.items()}
    for i in range(start, start + size):
        counters[f"memory-slice-{i}"] = _cap(1)
    return counters


def _full_counters(model: GpuModel) -> dict[str, dict[str, str]]:
    return _counter_values(model.max_capacities(), 0, model.memory_slices)


def mig_device(node: str, model: GpuModel, index: int, profile: MigProfile, start: int, dynamic: bool) -> Obj:
    """A MIG device: static (uuid + memorySlice<i> capacities) or dynamic (consumesCounters).

    Precondition: `start` is one of `profile.placements`.
    """
    if start not in profile.placements:
        raise ValueError(f"{profile.name} cannot be placed at memory slice {start}")
    attrs: Obj = {
        "type": _s("mig"),
        "parentUUID": _s(gpu_uuid(node, index)),
        "profile": _s(profile.name),
        **_common_attrs(model, node, index),
    }
    caps = {k: _cap(v) for k, v in profile.capacities().items()}
    dev: Obj = {"name": mig_device_name(index, profile, start), "attributes": attrs, "capacity": caps}
    if dynamic:
        dev["consumesCounters"] = [
            {
                "counterSet": counter_set_name(index),
                "counters": _counter_values(profile.capacities(), start, profile.memory_slices),
            }
        ]
    else:
        attrs["uuid"] = _s(mig_uuid(node, index, profile.name, start))
        for i in range(start, start + profile.memory_slices):
            caps[f"memorySlice{i}"] = _cap(1)
    return dev


def counter_set(model: GpuModel, index: int) -> Obj:
    """The per-GPU shared counter set `gpu-<minor>-counter-set` (DynamicMIG)."""
    return {"name": counter_set_name(index), "counters": _full_counters(model)}


def _is_advanced(dev: Obj) -> bool:
    return bool(dev.get("taints") or dev.get("consumesCounters"))


def _chunks(devices: list[Obj]) -> list[list[Obj]]:
    """Split a name-sorted device list so that no slice exceeds the API's per-slice device limit."""
    if not devices:
        return [[]]
    limit = MAX_DEVICES_PER_SLICE_ADVANCED if any(_is_advanced(d) for d in devices) else MAX_DEVICES_PER_SLICE
    return [devices[i : i + limit] for i in range(0, len(devices), limit)]
