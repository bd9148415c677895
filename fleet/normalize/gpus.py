"""GPU identity in ResourceSlices: model families, MIG profiles and the device records of a slice."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from fleet.normalize.helpers import _Reader
from fleet.normalize.records import DeviceRecord
from fleet.quantity import quantity_bytes
from fleet.taint_rules import TAINT_FIELDS

NVIDIA_GPU_DRIVER = "gpu.nvidia.com"


_FAMILIES = [
    (re.compile(r"\bGB300\b"), "GB300"),
    (re.compile(r"\bGB200\b"), "GB200"),
    (re.compile(r"\bB300\b"), "B300"),
    (re.compile(r"\bB200\b"), "B200"),
    (re.compile(r"\bH200\b"), "H200"),
    (re.compile(r"\bH100\b"), "H100"),
    (re.compile(r"\bA100\b"), "A100"),
]
MODEL_FAMILIES = (*(name for _, name in _FAMILIES), "other")


def model_family(product_name: str) -> str:
    """The model family of an NVML product name: "NVIDIA H100 80GB HBM3" -> "H100".

    Word boundaries keep Grace-Hopper "GH200" out of "H200": a superchip with its own memory is not
    interchangeable with an H200 for scheduling, so it is "other" until it gets a family of its own.
    """
    # A fleet has a handful of product names, repeated on 100,000 devices; odd long ones are not kept.
    return _cached_family(product_name) if len(product_name) <= CACHED_LENGTH else _family(product_name)


CACHED_LENGTH = 256  # longest text whose parse is cached (a published text could be huge)


def _family(product_name: str) -> str:
    for pattern, family in _FAMILIES:
        if pattern.search(product_name.upper()):
            return family
    return "other"


_cached_family = lru_cache(maxsize=1024)(_family)

_MIG_PROFILE = re.compile(r"^(\d+)g\.\d+gb")
_GPU_MINOR = re.compile(r"^gpu-(\d+)(?:-|$)")
FULL_GPU_SLICES = 7


def mig_compute_slices(profile: str) -> int:
    """The N of a MIG "Ng.Mgb[+attr]" profile; 0 when the text is not a MIG profile."""
    match = _MIG_PROFILE.match(profile)
    return int(match.group(1)) if match else 0


_ATTRIBUTE_TYPES = ("string", "version", "int", "bool", "strings", "versions", "ints", "bools")
_ATTRIBUTE_TYPE_SET = frozenset(_ATTRIBUTE_TYPES)
_MISSING = object()


def _attribute_value(r: _Reader, value: Any, path: str) -> Any:
    """A DeviceAttribute holds exactly one typed value (string/int/bool/version, or list forms)."""
    data = r.mapping(value, path, required=True)
    for key in _ATTRIBUTE_TYPES:
        if key in data:
            return data[key]
    raise r.fail(path, "attribute without a value")


def _attributes(r: _Reader, value: Any, path: str) -> dict[str, Any]:
    """A device's attributes as plain values. The usual shape (one typed value per attribute) takes a
    fast path: this runs for every attribute of every device, a million times for a large fleet."""
    out: dict[str, Any] = {}
    for key, item in r.mapping(value, path).items():
        if type(item) is dict and len(item) == 1:
            ((typ, plain),) = item.items()
            if typ in _ATTRIBUTE_TYPE_SET:
                out[key] = plain
                continue
        out[key] = _attribute_value(r, item, f"{path}.{key}")
    return out


def _memory_bytes(quantity: str | int) -> int | None:
    # A fleet publishes a few distinct memory sizes, on 100,000 devices.
    if isinstance(quantity, str) and len(quantity) > CACHED_LENGTH:
        return quantity_bytes(quantity)
    return _cached_quantity_bytes(quantity)


_cached_quantity_bytes = lru_cache(maxsize=4096, typed=True)(quantity_bytes)  # typed: True is not 1


def _device(
    r: _Reader, driver: str, slice_node: str, raw_device: Any, path: str
) -> tuple[DeviceRecord, dict[str, Any]]:
    dev = r.mapping(raw_device, path, required=True)
    # v1beta1 wraps the device's fields in "basic".
    body = r.mapping(dev.get("basic"), f"{path}.basic") if "basic" in dev else dev
    name = r.string(dev.get("name"), f"{path}.name", required=True, max_len=63)
    attributes = _attributes(r, body.get("attributes"), f"{path}.attributes")
    capacity: dict[str, Any] = {}
    for key, value in r.mapping(body.get("capacity"), f"{path}.capacity").items():
        if isinstance(value, dict):  # v1: {"value": "80Gi", ...}
            capacity[key] = value.get("value")
        elif isinstance(value, str):  # v1beta1 before DeviceCapacity: a bare quantity
            capacity[key] = value
        else:
            raise r.fail(f"{path}.capacity.{key}", "expected a quantity")

    def attr(short: str) -> str:
        value = attributes.get(short, _MISSING)
        if value is _MISSING:
            value = attributes.get(f"{driver}/{short}", "")
        return value if isinstance(value, str) else str(value)

    kind = attr("type") or "other"
    kind = kind if kind in ("gpu", "mig", "vfio", "channel") else "other"
    product = attr("productName")
    profile = attr("profile") if kind == "mig" else ""
    uuid = attr("uuid")
    parent = attr("parentUUID")
    minor_match = _GPU_MINOR.match(name)
    memory = capacity.get("memory") if kind in ("gpu", "mig") else capacity.get("addressableMemory")
    # Only the API's fields: a taint a DeviceTaintRule applies is told apart by a key of ours.
    taints = [
        {f: v for f, v in r.mapping(t, f"{path}.taints[{i}]").items() if f in TAINT_FIELDS}
        for i, t in enumerate(r.seq(body.get("taints"), f"{path}.taints"))
    ]
    counters = r.seq(body.get("consumesCounters"), f"{path}.consumesCounters")
    node = r.string(body.get("nodeName"), f"{path}.nodeName") or slice_node
    record = DeviceRecord(
        name=name,
        kind=kind,
        model=model_family(product) if kind in ("gpu", "mig", "vfio") else "other",
        product_name=product[:128],
        uuid=uuid[:128],
        parent_uuid=parent[:128],
        gpu_uuid=(parent if kind == "mig" else uuid)[:128] if kind in ("gpu", "mig", "vfio") else "",
        gpu_minor=int(minor_match.group(1)) if minor_match else None,
        mig_profile=profile[:64],
        compute_slices=mig_compute_slices(profile)
        if kind == "mig"
        else (FULL_GPU_SLICES if kind == "gpu" else 0),
        memory_bytes=_memory_bytes(memory) if isinstance(memory, str | int) else None,
        taints=taints,
        counters_consumed=[r.mapping(c, f"{path}.consumesCounters") for c in counters],
        attributes=attributes,
        capacity=capacity,
        node_name=node,
    )
    return record, dev
