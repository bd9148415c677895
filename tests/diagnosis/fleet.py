"""Small fleets for diagnosis tests, built with the simulator's NVIDIA object builders."""

from __future__ import annotations

from typing import Any

from claims.fleetstate import FleetState
from simulator import nvidia

Obj = dict[str, Any]
GPU = "device.attributes['gpu.nvidia.com']"
CAP = "device.capacity['gpu.nvidia.com']"


def node(name: str, model: str, **kwargs: Any) -> list[Obj]:
    """A Node and its slices (``kwargs`` go to ``nvidia.node_slices``)."""
    gpus = kwargs.get("gpus", 8)
    return [nvidia.node_object(name, model, gpus=gpus), *nvidia.node_slices(name, model, **kwargs)]


def held(
    name: str, node_name: str, devices: list[str], created: str, pod: str | None = "p", ns: str = "team"
) -> Obj:
    """An allocated claim holding ``devices`` of ``node_name`` (reserved by pod ``pod`` unless None)."""
    results = [{"request": "gpu", "device": d} for d in devices]
    reserved = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}] if pod else []
    return nvidia.claim_object(
        ns,
        name,
        [nvidia.exactly_request("gpu", "gpu.nvidia.com", len(devices))],
        status=nvidia.allocation_status(results, node_name, reserved),
        created=created,
    )


def state(*parts: list[Obj] | Obj) -> FleetState:
    objs: list[Obj] = list(nvidia.device_classes())
    for part in parts:
        objs += part if isinstance(part, list) else [part]
    return FleetState.from_objects(objs)


def claim(requests: list[Obj], constraints: list[Obj] | None = None, name: str = "want") -> Obj:
    """A pending claim as pasted by a user (no uid: a what-if)."""
    obj = nvidia.claim_object("team", name, requests, constraints)
    del obj["metadata"]["uid"]
    return obj
