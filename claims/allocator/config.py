"""The configuration an allocation carries (``status.allocation.devices.config``): the opaque config of
the classes of the chosen (sub)requests and the claim's own config for them, as upstream's allocator
writes it (``internal/experimental`` ``Allocate``, "Populate configs")."""

from __future__ import annotations

from claims.allocator.requests import Request
from claims.allocator.snapshot import Obj


def allocation_config(claim: Obj, chosen: dict[str, Request], classes: dict[str, Obj]) -> list[Obj]:
    """``chosen``: per request of the claim's spec (by name), the request that allocated it: itself, or
    the subrequest (named ``request/subrequest``) a firstAvailable request settled on."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    names = [r.get("name", "") for r in devices.get("requests") or []]
    used = {name: chosen[name].name for name in names if name in chosen}
    out: list[Obj] = []
    # Each class's configs once, listing every request of that class.
    by_class: dict[str, list[Obj]] = {}
    for name in names:
        request = chosen.get(name)
        if request is None or request.class_name not in classes:
            continue
        if request.class_name in by_class:
            for added in by_class[request.class_name]:
                added["requests"].append(request.name)
            continue
        entries = [
            {"source": "FromClass", "requests": [request.name], **_configuration(config)}
            for config in (classes[request.class_name].get("spec") or {}).get("config") or []
        ]
        by_class[request.class_name] = entries
        out += entries
    for config in devices.get("config") or []:
        wanted = config.get("requests") or []
        if not wanted or any(name in wanted or used.get(name) in wanted for name in names):
            from_claim: Obj = {"source": "FromClaim", **_configuration(config)}
            if wanted:
                from_claim["requests"] = list(wanted)
            out.append(from_claim)
    # A config that applies to every request lists none ("empty means all").
    for entry in out:
        listed = entry.get("requests")
        if listed and all(name in listed or used.get(name) in listed for name in names):
            del entry["requests"]
    return out


def _configuration(config: Obj) -> Obj:
    """The DeviceConfiguration members of a class or claim config (today only ``opaque``)."""
    return {k: v for k, v in config.items() if k != "requests"}
