"""Object dicts exactly as the NVIDIA GPU DRA driver and Kubernetes publish them (resource.k8s.io/v1).

This module is the single place that knows how `kubernetes-sigs/dra-driver-nvidia-gpu` shapes its
ResourceSlices (its `cmd/gpu-kubelet-plugin/deviceinfo.go`, `mig.go` and `driver.go`), which GPU models
exist and what their MIG catalogs look like (`NVIDIA/mig-parted`
`deployments/systemd/config-default.yaml`; real A100-40GB values in KEP-4815). Fixtures, the fleet
simulator and tests build their objects here so that every consumer (normalize, diagnosis, allocator
replay) is exercised against the same shapes a real 1.36/1.37 cluster serves.

Pure Python, no Django, no randomness: every uid, UUID and generated name is derived from the inputs
(uuid5 / sha256), so two runs with the same arguments produce byte-identical objects.

Facts copied from the driver source (main, 2026):
- full GPU device name `gpu-<minor>`; MIG name `gpu-<minor>-mig-<profile w/o dots, RFC1123>-<GI id>-<start>`
  (`mig.go` `ToCanonicalName`; `+` becomes `-`, so `1g.10gb+me` -> `1g10gb-me`);
- static MIG devices carry `uuid` lower-cased (`strings.ToLower(d.UUID)` in `deviceinfo.go`), so the
  attribute reads `mig-…`, while full GPUs keep NVML's `GPU-…`;
- static MIG capacities: multiprocessors, copyEngines, decoders, encoders, jpegEngines, ofaEngines, memory
  plus `memorySlice<i>` = 1 per occupied memory slice; dynamic MIG devices have the same capacities
  without the memory slices and express placement through `consumesCounters` (`partitions.go`);
- counter names are the capacity names in DNS form (`copy-engines`, …) plus `memory-slice-<i>`;
- the full GPU in DynamicMIG mode advertises the per-dimension maximum over all profiles and consumes every
  counter of its set;
- dynamic MIG skips no GI profile that has C == G (the `+me` GI profile is included: the skipped CI profile
  `1_SLICE_REV1` is a compute-instance variant, not the `+me` GPU-instance profile).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fleet.normalize import model_family as normalize_model_family
from fleet.quantity import parse_quantity as _parse_quantity

Obj = dict[str, Any]

GPU_DRIVER: Final = "gpu.nvidia.com"
CD_DRIVER: Final = "compute-domain.nvidia.com"
RESOURCE_API: Final = "resource.k8s.io/v1"

# API limits from staging/src/k8s.io/api/resource/v1/types.go @ kubernetes-1.36.3 (ResourceSliceMax*).
MAX_DEVICES_PER_SLICE: Final = 128
MAX_DEVICES_PER_SLICE_ADVANCED: Final = 64  # any device with taints / consumesCounters / list attributes
MAX_COUNTER_SETS_PER_SLICE: Final = 8
MAX_COUNTERS_PER_SET: Final = 32
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
MAX_RESULTS_PER_CLAIM: Final = 32

# Versions the fleet's driver reports. A single value keeps `matchAttribute: driverVersion` satisfiable.
DRIVER_VERSION: Final = "580.95.5"  # NVML "580.95.05", semver-normalised by the driver (leading zero dropped)
CUDA_DRIVER_VERSION: Final = "13.0.0"
KUBELET_VERSION: Final = "v1.36.2"

# Default creationTimestamp: Friday 2026-03-06 08:00 UTC; the `monday` scenario starts that evening.
DEFAULT_CREATED: Final = "2026-03-06T08:00:00Z"

# Fixed namespace for uuid5 so that ids are stable across runs and machines.
_UID_NAMESPACE: Final = uuid.UUID("5b0f8d0e-3c1a-4f7e-9d7a-6c1f2f0e9a11")

# The alphabet apimachinery's `utilrand.String` uses for generateName suffixes (no vowels, no 0/1/3).
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"


# ---------------------------------------------------------------------------------------------------------
# Deterministic identifiers
# ---------------------------------------------------------------------------------------------------------


def stable_uid(*parts: object) -> str:
    """A metadata.uid derived from `parts` (kind, namespace, name, …); same input, same uid."""
    return str(uuid.uuid5(_UID_NAMESPACE, "/".join(str(p) for p in parts)))


def name_suffix(*parts: object, length: int = 5) -> str:
    """The `generateName` random suffix, made deterministic: 5 chars of the apimachinery alphabet."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return "".join(_NAME_ALPHABET[b % len(_NAME_ALPHABET)] for b in digest[:length])


def node_uid(node: str) -> str:
    return stable_uid("Node", node)


def gpu_uuid(node: str, index: int) -> str:
    """NVML-style full GPU UUID (`GPU-<uuid>`), stable per (node, GPU index)."""
    return "GPU-" + str(uuid.uuid5(_UID_NAMESPACE, f"gpu/{node}/{index}"))


def mig_uuid(node: str, index: int, profile: str, start: int) -> str:
    """MIG device UUID as the driver publishes it: NVML's `MIG-<uuid>` lower-cased (deviceinfo.go)."""
    return "mig-" + str(uuid.uuid5(_UID_NAMESPACE, f"mig/{node}/{index}/{profile}/{start}"))


# ---------------------------------------------------------------------------------------------------------
# Quantities (only what we need to emit canonical strings and read them back)
# ---------------------------------------------------------------------------------------------------------

_BINARY_SUFFIXES: Final = (
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
)
_BINARY_SUFFIXES_KI: Final = (*_BINARY_SUFFIXES, ("Ki", 1 << 10))
_DECIMAL_SUFFIXES: Final = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def binary_quantity(value: int) -> str:
    """Canonical string of `resource.NewQuantity(value, BinarySI)` for a non-negative integer.

    apimachinery picks the largest binary suffix that keeps the mantissa an integer; values below 1024 (and
    values not divisible by 1024) are printed plain.
    """
    if value < 0:
        raise ValueError("negative quantities are not produced by the driver")
    for suffix, factor in _BINARY_SUFFIXES_KI:
        if value >= factor and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def parse_quantity(text: str) -> int:
    """Whole-number value of a Kubernetes quantity string ("80Gi", "16", "4k", "1e3")."""
    return math.ceil(_parse_quantity(str(text)).value)


# ---------------------------------------------------------------------------------------------------------
# GPU models and MIG catalogs (NVIDIA/mig-parted deployments/systemd/config-default.yaml; KEP-4815)
# ---------------------------------------------------------------------------------------------------------

# Profile kinds of a 7-compute-slice / 8-memory-slice GPU and their NVML GPU-instance profile ids
# (`nvidia-smi mig -lgip`): the ids match the driver's example names `gpu-0-mig-1g10gb-19-0`, `…-2g47gb-14-0`.
_KIND_GI_ID: Final = {"1g": 19, "1g+me": 20, "1g2x": 15, "2g": 14, "3g": 9, "4g": 5, "7g": 0}
_KIND_G: Final = {"1g": 1, "1g+me": 1, "1g2x": 1, "2g": 2, "3g": 3, "4g": 4, "7g": 7}
_KIND_MEM_SLICES: Final = {"1g": 1, "1g+me": 1, "1g2x": 2, "2g": 2, "3g": 4, "4g": 4, "7g": 8}
# Possible placements (start memory slice) from `nvidia-smi mig -lgipp` on A100/H100; Blackwell shows the same
# pattern (mig-parted counts 7/1/4/3/2/1/1 agree with it).
_KIND_PLACEMENTS: Final = {
    "1g": (0, 1, 2, 3, 4, 5, 6),
    "1g+me": (0, 1, 2, 3, 4, 5, 6),
    "1g2x": (0, 2, 4, 6),
    "2g": (0, 2, 4),
    "3g": (0, 4),
    "4g": (0,),
    "7g": (0,),
}
# Max instances of one profile filling a GPU (mig-parted `all-<profile>` entries of config-default.yaml).
_KIND_MAX_COUNT: Final = {"1g": 7, "1g+me": 1, "1g2x": 4, "2g": 3, "3g": 2, "4g": 1, "7g": 1}
PROFILE_KINDS: Final = ("1g", "1g+me", "1g2x", "2g", "3g", "4g", "7g")


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a model's MIG catalog (values as NVML reports them, or synthetic)."""

    name: str  # e.g. "1g.23gb", "1g.23gb+me"
    kind: str  # one of PROFILE_KINDS; layouts refer to kinds so they work for every model
    compute_slices: int  # G
    memory_mib: int  # NVML MemorySizeMB (which is MiB)
    memory_slices: int
    gi_profile_id: int
    placements: tuple[int, ...]  # possible placement starts, each spanning `memory_slices`
    max_count: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    synthetic: bool  # True when the MiB/SM/engine numbers are derived, not read from real NVML output

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def memory_quantity(self) -> str:
        return binary_quantity(self.memory_bytes)

    @property
    def name_part(self) -> str:
        """The profile inside a device name: dots removed, RFC1123 (`1g.10gb+me` -> `1g10gb-me`)."""
        return _rfc1123(self.name.replace(".", ""))

    def capacities(self) -> dict[str, int]:
        """CommonCapacitiesMig: capacity name -> integer value (memory in bytes)."""
        return {
            "multiprocessors": self.multiprocessors,
            "copyEngines": self.copy_engines,
            "decoders": self.decoders,
            "encoders": self.encoders,
            "jpegEngines": self.jpeg_engines,
            "ofaEngines": self.ofa_engines,
            "memory": self.memory_bytes,
        }


@dataclass(frozen=True)
class GpuModel:
    """A GPU model as NVML describes it, plus its MIG catalog (empty when the model has no MIG)."""

    key: str  # model family: "B200", "H100", …
    product_name: str  # NVML GetName
    architecture: str  # NVML architecture string as the driver publishes it
    compute_capability: str  # "major.minor"; the driver publishes it semver-normalised ("9.0.0")
    memory_mib: int  # NVML total memory (MiB)
    multiprocessors: int
    pci_device_id: str
    cpu_arch: str  # node architecture label (Grace systems are arm64)
    family_label: str  # GPU feature discovery `nvidia.com/gpu.family`
    mig_profiles: tuple[MigProfile, ...] = field(default_factory=tuple)
    memory_slices: int = 8
    compute_slices: int = 7
    synthetic_memory: bool = False

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def memory_quantity(self) -> str:
        return binary_quantity(self.memory_bytes)

    @property
    def cuda_compute_capability(self) -> str:
        """Semver form the driver publishes (`semver.MustParse("9.0").String()` == "9.0.0")."""
        return f"{self.compute_capability}.0"

    @property
    def gfd_product(self) -> str:
        """`nvidia.com/gpu.product` label value: GPU feature discovery replaces spaces with dashes."""
        return self.product_name.replace(" ", "-")

    def profile(self, kind_or_name: str) -> MigProfile:
        """Look a MIG profile up by kind ("3g") or by name ("3g.90gb")."""
        for p in self.mig_profiles:
            if kind_or_name in (p.kind, p.name):
                return p
        raise KeyError(f"{self.key} has no MIG profile {kind_or_name!r}")

    def max_capacities(self) -> dict[str, int]:
        """Per-dimension maximum over all MIG profiles: the full GPU's capacity in DynamicMIG mode."""
        out: dict[str, int] = {}
        for p in self.mig_profiles:
            for k, v in p.capacities().items():
                out[k] = max(out.get(k, 0), v)
        return out


def _seven_slice_catalog(
    names: Mapping[str, str],
    memory_mib: Mapping[str, int],
    sms: Mapping[str, int],
    engines: Mapping[str, tuple[int, int, int, int, int]],
    synthetic: bool,
) -> tuple[MigProfile, ...]:
    """The 7-profile catalog of a 7-compute/8-memory-slice GPU; `engines` = (ce, dec, enc, jpeg, ofa)."""
    out = []
    for kind in PROFILE_KINDS:
        ce, dec, enc, jpeg, ofa = engines[kind]
        out.append(
            MigProfile(
                name=names[kind],
                kind=kind,
                compute_slices=_KIND_G[kind],
                memory_mib=memory_mib[kind],
                memory_slices=_KIND_MEM_SLICES[kind],
                gi_profile_id=_KIND_GI_ID[kind],
                placements=_KIND_PLACEMENTS[kind],
                max_count=_KIND_MAX_COUNT[kind],
                multiprocessors=sms[kind],
                copy_engines=ce,
                decoders=dec,
                encoders=enc,
                jpeg_engines=jpeg,
                ofa_engines=ofa,
                synthetic=synthetic,
            )
        )
    return tuple(out)


def _names(one: str, double: str, three: str, seven: str) -> dict[str, str]:
    """Catalog names from mig-parted's profiles (1g, 1g double-memory = 2g memory, 3g = 4g memory, 7g)."""
    return {
        "1g": f"1g.{one}gb",
        "1g+me": f"1g.{one}gb+me",
        "1g2x": f"1g.{double}gb",
        "2g": f"2g.{double}gb",
        "3g": f"3g.{three}gb",
        "4g": f"4g.{three}gb",
        "7g": f"7g.{seven}gb",
    }


def _synthetic_memory(seven_g_mib: int) -> dict[str, int]:
    """SYNTHETIC per-profile MiB: whole memory-slice units (7g keeps its full size).

    Real NVML numbers for these GPUs were not available (KEP-4815 gives A100-40GB's only). Using
    `slices * floor(7g / 8)` (rounded down to 64 MiB) guarantees that every valid placement combination
    fits in the full GPU's memory counter, which is the property the allocator relies on.
    """
    unit = (seven_g_mib // 8) // 64 * 64
    mem = {k: _KIND_MEM_SLICES[k] * unit for k in PROFILE_KINDS}
    mem["7g"] = seven_g_mib
    return mem


def _linear_sms(per_slice: int) -> dict[str, int]:
    """SYNTHETIC SM counts: G * per_slice (the double-memory 1g keeps one slice's SMs)."""
    return {k: _KIND_G[k] * per_slice for k in PROFILE_KINDS}


# (copyEngines, decoders, encoders, jpegEngines, ofaEngines). Hopper-style: one NVDEC/NVJPG per compute slice,
# no NVENC, a single OFA that only `+me` and `7g` get (which is why `+me` has max count 1).
_HOPPER_ENGINES: Final = {
    "1g": (1, 1, 0, 1, 0),
    "1g+me": (1, 1, 0, 1, 1),
    "1g2x": (1, 1, 0, 1, 0),
    "2g": (2, 2, 0, 2, 0),
    "3g": (3, 3, 0, 3, 0),
    "4g": (4, 4, 0, 4, 0),
    "7g": (7, 7, 0, 7, 1),
}
# A100-40GB values from the KEP 4815 table (real NVML); the 80GB part has the same engines.
_AMPERE_ENGINES: Final = {
    "1g": (1, 0, 0, 0, 0),
    "1g+me": (1, 1, 0, 1, 1),
    "1g2x": (1, 1, 0, 0, 0),
    "2g": (2, 1, 0, 0, 0),
    "3g": (3, 2, 0, 0, 0),
    "4g": (4, 2, 0, 0, 0),
    "7g": (7, 5, 0, 1, 1),
}


def _build_models() -> dict[str, GpuModel]:
    models: list[GpuModel] = []

    # A100-SXM4-80GB: memory from `nvidia-smi mig -lgip` (9.50/19.50/39.25/79.25 GiB, recalled, not
    # re-verified here); SMs and engines from the A100-40GB KEP table (same die).
    models.append(
        GpuModel(
            key="A100",
            product_name="NVIDIA A100-SXM4-80GB",
            architecture="Ampere",
            compute_capability="8.0",
            memory_mib=81920,
            multiprocessors=108,
            pci_device_id="0x20B2",
            cpu_arch="amd64",
            family_label="ampere",
            mig_profiles=_seven_slice_catalog(
                _names("10", "20", "40", "80"),
                {
                    "1g": 9728,
                    "1g+me": 9728,
                    "1g2x": 19968,
                    "2g": 19968,
                    "3g": 40192,
                    "4g": 40192,
                    "7g": 81152,
                },
                {"1g": 14, "1g+me": 14, "1g2x": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98},
                _AMPERE_ENGINES,
                synthetic=False,
            ),
        )
    )
    # H100 80GB HBM3: 81559 MiB total; MIG memory 9.75/19.62/39.50/79.25 GiB and SMs 16/26/32/60/64/132 as
    # printed by `nvidia-smi mig -lgip` (recalled; UNCERTAIN: verify against a real slice).
    models.append(
        GpuModel(
            key="H100",
            product_name="NVIDIA H100 80GB HBM3",
            architecture="Hopper",
            compute_capability="9.0",
            memory_mib=81559,
            multiprocessors=132,
            pci_device_id="0x2330",
            cpu_arch="amd64",
            family_label="hopper",
            mig_profiles=_seven_slice_catalog(
                _names("10", "20", "40", "80"),
                {
                    "1g": 9984,
                    "1g+me": 9984,
                    "1g2x": 20096,
                    "2g": 20096,
                    "3g": 40448,
                    "4g": 40448,
                    "7g": 81152,
                },
                {"1g": 16, "1g+me": 16, "1g2x": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132},
                _HOPPER_ENGINES,
                synthetic=False,
            ),
        )
    )
    # H200: total 143771 MiB; MIG MiB SYNTHETIC (slice units of a 140 GiB 7g); SMs as H100 (same GH100 die).
    models.append(
        GpuModel(
            key="H200",
            product_name="NVIDIA H200",
            architecture="Hopper",
            compute_capability="9.0",
            memory_mib=143771,
            multiprocessors=132,
            pci_device_id="0x2335",
            cpu_arch="amd64",
            family_label="hopper",
            mig_profiles=_seven_slice_catalog(
                _names("18", "35", "71", "141"),
                _synthetic_memory(143360),
                {"1g": 16, "1g+me": 16, "1g2x": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132},
                _HOPPER_ENGINES,
                synthetic=True,
            ),
            synthetic_memory=True,
        )
    )
    # Blackwell: totals and every MIG number below are SYNTHETIC (plausible, internally consistent).
    # fmt: off
    blackwell = [  # a table reads better unwrapped
        # key, product name, cc, total MiB, SMs, 7g MiB, SMs per slice, pci id, cpu arch, catalog names
        ("B200", "NVIDIA B200", "10.0", 183359, 148, 182528, 18, "0x2901", "amd64", ("23", "45", "90", "180")),  # noqa: E501
        ("GB200", "NVIDIA GB200", "10.0", 189471, 152, 188928, 18, "0x2941", "arm64", ("23", "47", "93", "186")),  # noqa: E501
        ("B300", "NVIDIA B300 SXM6 AC", "10.3", 275040, 148, 274432, 20, "0x3182", "amd64", ("34", "67", "135", "269")),  # noqa: E501
        ("GB300", "NVIDIA GB300", "10.3", 284672, 152, 284160, 20, "0x31C2", "arm64", ("35", "70", "139", "278")),  # noqa: E501
    ]
    # fmt: on
    for key, product, cc, total, sm_total, seven_g, per_slice, pci, arch, names in blackwell:
        sms = _linear_sms(per_slice)
        sms["7g"] = min(sm_total, per_slice * 8)
        models.append(
            GpuModel(
                key=key,
                product_name=product,
                architecture="Blackwell",
                compute_capability=cc,
                memory_mib=total,
                multiprocessors=sm_total,
                pci_device_id=pci,
                cpu_arch=arch,
                family_label="blackwell",
                mig_profiles=_seven_slice_catalog(
                    _names(*names), _synthetic_memory(seven_g), sms, _HOPPER_ENGINES, synthetic=True
                ),
                synthetic_memory=True,
            )
        )
    return {m.key: m for m in models}


MODELS: Final[dict[str, GpuModel]] = _build_models()

# Static MIG layouts as (profile kind, placement start) per GPU. Names follow mig-parted's config names.
LAYOUTS: Final[dict[str, tuple[tuple[str, int], ...]]] = {
    "all-1g": tuple(("1g", s) for s in range(7)),
    "all-1g2x": tuple(("1g2x", s) for s in (0, 2, 4, 6)),
    "all-2g": (("2g", 0), ("2g", 2), ("2g", 4)),
    "all-3g": (("3g", 0), ("3g", 4)),
    "all-4g": (("4g", 0),),
    "all-7g": (("7g", 0),),
    # mig-parted "balanced": 2x1g + 1x2g + 1x3g (7 compute slices, 8 memory slices).
    "balanced": (("1g", 0), ("1g", 1), ("2g", 2), ("3g", 4)),
}
# "mixed": different layouts on the GPUs of one node, cycled by GPU index.
MIXED_CYCLE: Final = ("balanced", "all-1g", "all-3g", "all-1g", "balanced", "all-2g", "all-1g", "all-7g")


def layout_for_gpu(layout: str | None, index: int) -> str:
    """Layout name of GPU `index`: `layout` may be a name, "mixed", or a comma list cycled over the GPUs."""
    name = layout or "balanced"
    if name == "mixed":
        return MIXED_CYCLE[index % len(MIXED_CYCLE)]
    if "," in name:
        parts = [p.strip() for p in name.split(",")]
        return parts[index % len(parts)]
    return name


model_family = normalize_model_family  # one definition of the families, shared with normalize


def _rfc1123(name: str) -> str:
    """`toRFC1123Compliant` from the driver: lower-case, non [a-z0-9-.] -> '-', trim '-'."""
    out = "".join(c if (c.isascii() and (c.isalnum() or c in "-.")) else "-" for c in name.lower())
    return out.strip("-").removesuffix(".")[:253]


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


# ---------------------------------------------------------------------------------------------------------
# Attributes and devices
# ---------------------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------------------
# Kubernetes objects
# ---------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------
# Claims, templates, pods, events
# ---------------------------------------------------------------------------------------------------------


def exactly_request(
    name: str,
    device_class: str,
    count: int = 1,
    selectors: Sequence[str] = (),
    admin_access: bool = False,
    allocation_mode: str = "ExactCount",
    tolerations: Sequence[dict[str, Any]] | None = None,
    capacity: dict[str, str] | None = None,
) -> Obj:
    """A DeviceRequest with `exactly` (selectors are CEL expressions)."""
    ex: Obj = {"deviceClassName": device_class, "allocationMode": allocation_mode}
    if allocation_mode == "ExactCount":
        ex["count"] = count
    if selectors:
        ex["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if admin_access:
        ex["adminAccess"] = True
    if tolerations:
        ex["tolerations"] = [dict(t) for t in tolerations]
    if capacity:
        ex["capacity"] = {"requests": dict(capacity)}
    return {"name": name, "exactly": ex}


def subrequest(
    name: str,
    device_class: str,
    count: int = 1,
    selectors: Sequence[str] = (),
    allocation_mode: str = "ExactCount",
) -> Obj:
    """One `firstAvailable` entry (no adminAccess on subrequests)."""
    sub: Obj = {"name": name, "deviceClassName": device_class, "allocationMode": allocation_mode}
    if allocation_mode == "ExactCount":
        sub["count"] = count
    if selectors:
        sub["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return sub


def first_available_request(name: str, subrequests: Sequence[dict[str, Any]]) -> Obj:
    return {"name": name, "firstAvailable": [dict(s) for s in subrequests]}


def _claim_spec(
    requests: Sequence[dict[str, Any]],
    constraints: Sequence[dict[str, Any]] | None,
    config: Sequence[dict[str, Any]] | None,
) -> Obj:
    devices: Obj = {"requests": [dict(r) for r in requests]}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    if config:
        devices["config"] = [dict(c) for c in config]
    return {"devices": devices}


def claim_object(
    namespace: str,
    name: str,
    requests: Sequence[dict[str, Any]],
    constraints: Sequence[dict[str, Any]] | None = None,
    uid: str | None = None,
    config: Sequence[dict[str, Any]] | None = None,
    status: dict[str, Any] | None = None,
    owner_pod: dict[str, Any] | None = None,
    pod_claim_name: str | None = None,
    labels: dict[str, str] | None = None,
    created: str | None = None,
) -> Obj:
    """A ResourceClaim. With `owner_pod` it looks template-generated (owner ref + pod-claim-name annotation).

    `status` is typically `allocation_status(...)`; an allocated claim also gets the scheduler's
    `resource.kubernetes.io/delete-protection` finalizer.
    """
    meta = _meta("ResourceClaim", name, namespace, created, uid)
    if labels:
        meta["labels"] = dict(labels)
    if owner_pod is not None:
        pmeta = owner_pod["metadata"]
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pmeta["name"],
                "uid": pmeta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        if pod_claim_name:
            meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": pod_claim_name}
            meta["generateName"] = generated_claim_prefix(pmeta["name"], pod_claim_name)
    obj: Obj = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": _claim_spec(requests, constraints, config),
    }
    if status:
        obj["status"] = dict(status)
        if status.get("allocation"):
            meta["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    return obj


def claim_template(
    namespace: str,
    name: str,
    requests: Sequence[dict[str, Any]],
    constraints: Sequence[dict[str, Any]] | None = None,
    config: Sequence[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    created: str | None = None,
) -> Obj:
    """A ResourceClaimTemplate (spec.spec is a ResourceClaimSpec)."""
    meta = _meta("ResourceClaimTemplate", name, namespace, created)
    if labels:
        meta["labels"] = dict(labels)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {"spec": _claim_spec(requests, constraints, config)},
    }


def generated_claim_prefix(pod: str, pod_claim: str) -> str:
    """GenerateName `<pod>-<podClaimName>-` with both parts cut proportionally when longer than 57 chars."""
    max_len = 57
    if len(pod) + len(pod_claim) > max_len:
        pod_len = max_len * len(pod) // (len(pod) + len(pod_claim))
        claim_len = max_len - pod_len
        pod, pod_claim = pod[:pod_len], pod_claim[:claim_len]
    return f"{pod}-{pod_claim}-"


def generated_claim_name(pod: str, pod_claim: str) -> str:
    """The name the ResourceClaim controller would give the pod's claim (deterministic suffix)."""
    return generated_claim_prefix(pod, pod_claim) + name_suffix("claim", pod, pod_claim)


def from_claim(claim_name: str) -> dict[str, str]:
    """Pod claim source referencing an existing ResourceClaim (use as second tuple item in pod_object)."""
    return {"resourceClaimName": claim_name}


def from_template(template_name: str) -> dict[str, str]:
    return {"resourceClaimTemplateName": template_name}


def scheduled_condition(ts: str) -> Obj:
    return {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts, "lastProbeTime": None}


def unschedulable_condition(message: str, ts: str, reason: str = "Unschedulable") -> Obj:
    """PodScheduled=False, reason "Unschedulable" (rejected) or "SchedulerError" (Filter error, e.g. CEL)."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": ts,
        "lastProbeTime": None,
    }


def pod_object(
    namespace: str,
    name: str,
    claims: Sequence[tuple[str, str | dict[str, str]]],
    node: str | None = None,
    scheduled: dict[str, Any] | None = None,
    claim_statuses: Mapping[str, str] | None = None,
    phase: str | None = None,
    labels: dict[str, str] | None = None,
    uid: str | None = None,
    created: str | None = None,
    image: str = "nvcr.io/nvidia/pytorch:25.08-py3",
    owner: dict[str, Any] | None = None,
) -> Obj:
    """A Pod using DRA claims.

    `claims`: (podClaimName, source); a str source is a ResourceClaimTemplate name, a dict is taken as-is
    (`from_claim("x")` / `from_template("t")`). `claim_statuses` maps podClaimName -> generated claim name
    (pod.status.resourceClaimStatuses); templates without an entry look "claim not created yet".
    `scheduled`: PodScheduled condition (see `unschedulable_condition`); default True when `node` is set.
    `phase` defaults to Running on a node, Pending otherwise.
    """
    ts = created or DEFAULT_CREATED
    meta = _meta("Pod", name, namespace, created, uid)
    meta["labels"] = dict(labels or {})
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    pod_claims = []
    for pod_claim, source in claims:
        src = from_template(source) if isinstance(source, str) else dict(source)
        pod_claims.append({"name": pod_claim, **src})
    spec: Obj = {
        "containers": [
            {
                "name": "main",
                "image": image,
                "resources": {"claims": [{"name": pc} for pc, _ in claims]},
            }
        ],
        "resourceClaims": pod_claims,
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    }
    if node:
        spec["nodeName"] = node
    conditions = []
    if scheduled is not None:
        conditions.append(dict(scheduled))
    elif node:
        conditions.append(scheduled_condition(ts))
    status: Obj = {"phase": phase or ("Running" if node else "Pending"), "qosClass": "BestEffort"}
    if conditions:
        status["conditions"] = conditions
    if claim_statuses:
        status["resourceClaimStatuses"] = [
            {"name": k, "resourceClaimName": v} for k, v in claim_statuses.items()
        ]
    if node and status["phase"] == "Running":
        status["startTime"] = ts
        octets = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
        status["podIP"] = f"172.{16 + octets[0] % 16}.{octets[1]}.{octets[2] % 254 + 1}"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def consumer_ref(pod: dict[str, Any]) -> Obj:
    """A `reservedFor` entry for a pod (core group: apiGroup omitted as the API server does)."""
    return {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


def node_selector_for(node: str) -> Obj:
    """The allocation nodeSelector the scheduler builds for devices from a node-local slice."""
    return {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }


def allocation_status(
    results: Sequence[dict[str, Any]],
    node: str,
    reserved_for: Iterable[dict[str, Any]] = (),
    config: Sequence[dict[str, Any]] | None = None,
) -> Obj:
    """`status` of an allocated claim: results {request, driver, pool, device[, adminAccess]} + nodeSelector.

    Results default driver gpu.nvidia.com and pool = `node`. `reserved_for` takes pods or ready
    `{resource, name, uid}` entries; an empty list leaves the claim allocated but unreserved.
    """
    out_results = []
    for r in results:
        res: Obj = {
            "request": r["request"],
            "driver": r.get("driver", GPU_DRIVER),
            "pool": r.get("pool", node),
            "device": r["device"],
        }
        if r.get("adminAccess"):
            res["adminAccess"] = True
        if r.get("tolerations"):
            res["tolerations"] = list(r["tolerations"])
        out_results.append(res)
    devices: Obj = {"results": out_results}
    if config:
        devices["config"] = list(config)
    status: Obj = {"allocation": {"devices": devices, "nodeSelector": node_selector_for(node)}}
    refs = [consumer_ref(p) if "metadata" in p else dict(p) for p in reserved_for]
    if refs:
        status["reservedFor"] = refs
    return status


def _event(
    pod: dict[str, Any],
    reason: str,
    message: str,
    count: int,
    first_timestamp: str,
    last_timestamp: str,
    component: str,
    action: str,
) -> Obj:
    pmeta = pod["metadata"]
    ns = pmeta.get("namespace", "default")
    # Event names are `<object>.<hex>`; derive the hex from the content so it is stable.
    key = f"{reason}/{ns}/{pmeta['name']}/{first_timestamp}"
    name = f"{pmeta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    meta = _meta("Event", name, ns, first_timestamp)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": meta,
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": ns,
            "name": pmeta["name"],
            "uid": pmeta["uid"],
        },
        "type": "Warning",
        "reason": reason,
        "message": message,
        "count": count,
        "firstTimestamp": first_timestamp,
        "lastTimestamp": last_timestamp,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": "",
        "action": action,
        "eventTime": None,
    }


def failed_scheduling_event(
    pod: dict[str, Any],
    message: str,
    count: int = 1,
    first_timestamp: str | None = None,
    last_timestamp: str | None = None,
) -> Obj:
    """Warning `FailedScheduling` from default-scheduler about `pod`."""
    first = first_timestamp or pod["metadata"].get("creationTimestamp") or DEFAULT_CREATED
    return _event(
        pod,
        "FailedScheduling",
        message,
        count,
        first,
        last_timestamp or first,
        "default-scheduler",
        "Scheduling",
    )


def failed_claim_creation_event(
    pod: dict[str, Any],
    pod_claim_name: str,
    error: str,
    count: int = 1,
    first_timestamp: str | None = None,
    last_timestamp: str | None = None,
) -> Obj:
    """Warning `FailedResourceClaimCreation` from the ResourceClaim controller (kube-controller-manager)."""
    first = first_timestamp or pod["metadata"].get("creationTimestamp") or DEFAULT_CREATED
    return _event(
        pod,
        "FailedResourceClaimCreation",
        f"PodResourceClaim {pod_claim_name}: {error}",
        count,
        first,
        last_timestamp or first,
        "resource_claim",
        "",
    )


# ---------------------------------------------------------------------------------------------------------
# Scheduler messages (pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go)
# ---------------------------------------------------------------------------------------------------------

CANNOT_ALLOCATE: Final = "cannot allocate all claims"


def fit_error_message(total_nodes: int, reasons: Mapping[str, int], preemption: bool = True) -> str:
    """`FitError.Error()`: "0/N nodes are available: <n> <reason>, …." plus the PostFilter preemption text."""
    parts = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: kv[0]))
    msg = f"0/{total_nodes} nodes are available: {parts}."
    if preemption:
        msg += (
            f" still not schedulable, preemption: 0/{total_nodes} nodes are available: "
            f"{total_nodes} Preemption is not helpful for scheduling."
        )
    return msg


def cel_runtime_error_message(namespace: str, claim: str, selector_index: int, detail: str) -> str:
    """SchedulerError text for a request selector failing at runtime (``selectorsMatch`` in
    ``dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go``);
    exact CEL detail UNCERTAIN."""
    return (
        f'running "DynamicResources" filter plugin: claim {namespace}/{claim}: '
        f"selector #{selector_index}: CEL runtime error: {detail}"
    )
