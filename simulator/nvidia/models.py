"""GPU models and their MIG catalogs (NVIDIA/mig-parted ``deployments/systemd/config-default.yaml``;
real A100-40GB values in KEP-4815), and the per-GPU MIG layouts of a fleet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from fleet.normalize import model_family as normalize_model_family
from simulator.nvidia.constants import binary_quantity

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
