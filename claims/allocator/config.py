"""The configuration an allocation carries (``status.allocation.devices.config``): the opaque config of
the classes of the chosen (sub)requests and the claim's own config for them, as upstream's allocator
writes it (``internal/experimental`` ``Allocate``, "Populate configs")."""

from __future__ import annotations

from claims.allocator.snapshot import Obj


def allocation_config(claim: Obj, chosen: dict[str, str], classes: dict[str, Obj]) -> list[Obj]:
    """``chosen``: per request of the claim's spec, the name of the request that allocated it (itself,
    or ``request/subrequest`` for the subrequest a firstAvailable request settled on)."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    requests = [r.get("name", "") for r in devices.get("requests") or []]
    subrequest_specs = {
        f"{r.get('name', '')}/{s.get('name', '')}": s
        for r in devices.get("requests") or []
        for s in r.get("firstAvailable") or []
    }
    exact_specs = {r.get("name", ""): r.get("exactly") or {} for r in devices.get("requests") or []}
    out: list[Obj] = []
    # Each class's configs once, listing every request of that class.
    by_class: dict[str, list[Obj]] = {}
    for name in requests:
        used = chosen.get(name)
        if used is None:
            continue
        spec = subrequest_specs.get(used) if "/" in used else exact_specs.get(used)
        class_name = (spec or {}).get("deviceClassName", "")
        device_class = classes.get(class_name)
        if device_class is None:
            continue
        if class_name in by_class:
            for added in by_class[class_name]:
                added["requests"].append(used)
            continue
        entries = [
            {"source": "FromClass", "requests": [used], **_configuration(config)}
            for config in (device_class.get("spec") or {}).get("config") or []
        ]
        by_class[class_name] = entries
        out += entries
    for config in devices.get("config") or []:
        wanted = config.get("requests") or []
        if not wanted or any(name in wanted or chosen.get(name) in wanted for name in requests):
            from_claim: Obj = {"source": "FromClaim", **_configuration(config)}
            if wanted:
                from_claim["requests"] = list(wanted)
            out.append(from_claim)
    # A config that applies to every request lists none ("empty means all").
    for entry in out:
        listed = entry.get("requests")
        if listed and all(name in listed or chosen.get(name) in listed for name in requests):
            del entry["requests"]
    return out


def _configuration(config: Obj) -> Obj:
    """The DeviceConfiguration members of a class or claim config (today only ``opaque``)."""
    return {k: v for k, v in config.items() if k not in ("requests", "source")}
