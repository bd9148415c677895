"""Driver names and versions, API limits, deterministic identifiers and quantity strings: what every
builder of :mod:`simulator.nvidia` shares.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from typing import Any, Final

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
