"""A first-fit STAND-IN for the DRA scheduler, for the simulator's tests and demo only.

It is NOT the structured allocator (that replay lives in claims/allocator/) and must not be used to explain
real scheduling outcomes. What it does:
- nodes in name order; per node, the pod's unallocated claims, requests in spec order, devices in
  pool/slice/device-name order (first fit, no backtracking across requests);
- device classes: only the NVIDIA ones, recognised by name (driver + `type` attribute), no CEL evaluation of
  class selectors;
- request selectors: a few literal forms are understood so the simulator can show realistic failures —
  `device.attributes['<domain>'].<attr> == '<value>'` (string equality),
  `device.capacity['<domain>'].memory.compareTo(quantity('<q>')) >= 0`, and any other reference to
  `device.attributes['<domain>'].<attr>` that the device does not publish, which is reported the way the real
  scheduler reports a CEL runtime error (SchedulerError). Other selector text is treated as matching;
- `count` (ExactCount), `firstAvailable` in order (result request "req/sub"), `adminAccess` (does not
  consume);
- `matchAttribute` constraints within a request (devices are grouped by the attribute value);
- untolerated NoSchedule/NoExecute taints exclude a device; DynamicMIG counters are honoured.
Not handled: allocationMode All, constraints across requests, distinctAttribute, consumable capacity,
tolerations, extended resources, pools spanning nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from simulator import nvidia as nv
from simulator.scheduling import ClusterState, Decision, DeviceKey

Obj = dict[str, Any]

# class name -> (driver, value of the driver-domain `type` attribute)
CLASS_MATCH: dict[str, tuple[str, str]] = {
    "gpu.nvidia.com": (nv.GPU_DRIVER, "gpu"),
    "mig.nvidia.com": (nv.GPU_DRIVER, "mig"),
    "vfio.gpu.nvidia.com": (nv.GPU_DRIVER, "vfio"),
    "compute-domain-default-channel.nvidia.com": (nv.CD_DRIVER, "channel"),
    "compute-domain-daemon.nvidia.com": (nv.CD_DRIVER, "daemon"),
}

_EQ = re.compile(r"^\s*device\.attributes\['([^']+)'\]\.(\w+)\s*==\s*'([^']*)'\s*$")
_MEM = re.compile(
    r"^\s*device\.capacity\['([^']+)'\]\.memory\.compareTo\(quantity\('([^']+)'\)\)\s*>=\s*0\s*$"
)
_ATTR_REF = re.compile(r"device\.attributes\['([^']+)'\]\.(\w+)")


class CelRuntimeError(Exception):
    """A selector referenced an attribute the device lacks: the real scheduler aborts the attempt."""

    claim: str = "?"
    selector_index: int = 0


def _attr(device: Obj, driver: str, domain: str, name: str) -> Any:
    attrs = device.get("attributes", {})
    value = attrs.get(f"{domain}/{name}")
    if value is None and domain == driver:
        value = attrs.get(name)
    if value is None:
        return None
    return next(iter(value.values()))


def _selector_matches(expr: str, device: Obj, driver: str) -> bool:
    """Evaluate one of the understood selector forms (see module docstring). Raises CelRuntimeError."""
    m = _EQ.match(expr)
    if m:
        domain, name, want = m.groups()
        if domain != driver:
            return False  # in CEL, attributes of another domain are an empty map: the lookup errors, but
            # only for devices of that driver, which the class selector already excluded
        got = _attr(device, driver, domain, name)
        if got is None:
            raise CelRuntimeError(f"no such key: {name}")
        return bool(got == want)
    m = _MEM.match(expr)
    if m:
        domain, quantity = m.groups()
        cap = device.get("capacity", {}).get("memory") if domain == driver else None
        if cap is None:
            raise CelRuntimeError("no such key: memory")
        return nv.parse_quantity(cap["value"]) >= nv.parse_quantity(quantity)
    for domain, name in _ATTR_REF.findall(expr):
        if domain == driver and _attr(device, driver, domain, name) is None:
            raise CelRuntimeError(f"no such key: {name}")
    return True


def _blocked_by_taint(device: Obj) -> bool:
    return any(t.get("effect") in ("NoSchedule", "NoExecute") for t in device.get("taints", []))


class _NodeView:
    """Devices of one node with their counter sets and what is already taken."""

    def __init__(self, slices: list[Obj], allocated: Mapping[DeviceKey, str]) -> None:
        self.devices: list[tuple[str, str, Obj]] = []  # (driver, pool, device)
        self.counters: dict[tuple[str, str, str], dict[str, int]] = {}  # (driver, pool, set) -> remaining
        for s in sorted(
            slices, key=lambda s: (s["spec"]["driver"], s["spec"]["pool"]["name"], s["metadata"]["name"])
        ):
            driver, pool = s["spec"]["driver"], s["spec"]["pool"]["name"]
            for cs in s["spec"].get("sharedCounters", []):
                self.counters[(driver, pool, cs["name"])] = {
                    k: nv.parse_quantity(v["value"]) for k, v in cs["counters"].items()
                }
            for d in s["spec"].get("devices", []):
                self.devices.append((driver, pool, d))
        self.taken: set[DeviceKey] = set(allocated)
        for driver, pool, d in self.devices:
            if (driver, pool, d["name"]) in allocated:
                self.consume(driver, pool, d)

    def fits_counters(self, driver: str, pool: str, device: Obj) -> bool:
        for c in device.get("consumesCounters", []):
            remaining = self.counters.get((driver, pool, c["counterSet"]))
            if remaining is None:
                return False
            for k, v in c["counters"].items():
                if remaining.get(k, 0) < nv.parse_quantity(v["value"]):
                    return False
        return True

    def consume(self, driver: str, pool: str, device: Obj, sign: int = 1) -> None:
        for c in device.get("consumesCounters", []):
            remaining = self.counters.get((driver, pool, c["counterSet"]))
            if remaining is not None:
                for k, v in c["counters"].items():
                    remaining[k] = remaining.get(k, 0) - sign * nv.parse_quantity(v["value"])


def _candidates(view: _NodeView, device_class: str, selectors: Iterable[str], admin: bool) -> list[DeviceKey]:
    match = CLASS_MATCH.get(device_class)
    if match is None:
        return []
    driver_want, type_want = match
    out = []
    exprs = list(selectors)
    for driver, pool, d in view.devices:
        if driver != driver_want or _attr(d, driver, driver, "type") != type_want:
            continue
        key = (driver, pool, d["name"])
        if not admin and (
            key in view.taken or not view.fits_counters(driver, pool, d) or _blocked_by_taint(d)
        ):
            continue
        ok = True
        for i, e in enumerate(exprs):
            try:
                ok = _selector_matches(e, d, driver)
            except CelRuntimeError as err:
                err.selector_index = i
                raise
            if not ok:
                break
        if ok:
            out.append(key)
    return out


def _pick(
    view: _NodeView,
    device_class: str,
    count: int,
    selectors: list[str],
    admin: bool,
    match_attr: str | None,
) -> list[DeviceKey] | None:
    """First-fit choice of `count` devices, honouring counters between the chosen devices themselves."""
    cands = _candidates(view, device_class, selectors, admin)
    by_key = {(drv, pool, d["name"]): d for drv, pool, d in view.devices}
    groups: dict[Any, list[DeviceKey]] = {}
    for key in cands:
        if match_attr:
            domain, _, name = match_attr.rpartition("/")
            value = _attr(by_key[key], key[0], domain, name)
            if value is None:
                continue
            groups.setdefault(value, []).append(key)
        else:
            groups.setdefault(None, []).append(key)
    for keys in groups.values():
        chosen: list[DeviceKey] = []
        for key in keys:
            d = by_key[key]
            if not admin and not view.fits_counters(key[0], key[1], d):
                continue
            chosen.append(key)
            if not admin:
                view.consume(key[0], key[1], d)
            if len(chosen) == count:
                break
        if len(chosen) == count:
            return chosen
        for key in chosen:  # roll back this group's tentative consumption
            if not admin:
                view.consume(key[0], key[1], by_key[key], sign=-1)
    return None


def _request_selectors(req: Obj) -> list[str]:
    return [s["cel"]["expression"] for s in req.get("selectors", []) if "cel" in s]


def _match_attr_for(claim: Obj, request: str) -> str | None:
    for c in claim["spec"]["devices"].get("constraints", []):
        reqs = c.get("requests") or []
        if c.get("matchAttribute") and (not reqs or request in reqs):
            return str(c["matchAttribute"])
    return None


def _allocate_on_node(view: _NodeView, claims: list[Obj]) -> dict[str, list[Obj]] | None:
    """Allocation results per claim on this node, or None. Raises CelRuntimeError."""
    out: dict[str, list[Obj]] = {}
    for claim in claims:
        try:
            results = _allocate_claim(view, claim)
        except CelRuntimeError as err:
            err.claim = claim["metadata"]["name"]
            raise
        if results is None:
            return None
        meta = claim["metadata"]
        out[f"{meta.get('namespace', '')}/{meta['name']}"] = results
    return out


def _allocate_claim(view: _NodeView, claim: Obj) -> list[Obj] | None:
    """Results for one claim on this node (requests in order, first fit), or None."""
    results: list[Obj] = []
    for req in claim["spec"]["devices"]["requests"]:
        match_attr = _match_attr_for(claim, req["name"])
        options: list[tuple[str, Obj]] = []
        if "exactly" in req:
            options = [(req["name"], req["exactly"])]
        else:
            options = [(f"{req['name']}/{s['name']}", s) for s in req.get("firstAvailable", [])]
        for request_name, sub in options:
            if sub.get("allocationMode", "ExactCount") != "ExactCount":
                continue
            admin = bool(sub.get("adminAccess"))
            picked = _pick(
                view,
                sub["deviceClassName"],
                int(sub.get("count", 1)),
                _request_selectors(sub),
                admin,
                match_attr,
            )
            if picked is not None:
                for key in picked:
                    if not admin:
                        view.taken.add(key)
                    r: Obj = {"request": request_name, "driver": key[0], "pool": key[1], "device": key[2]}
                    if admin:
                        r["adminAccess"] = True
                    results.append(r)
                break
        else:
            return None
    return results


def naive_schedule(pod: Obj, claims: list[Obj], state: ClusterState) -> Decision:
    """First-fit stand-in for the DRA scheduler (see module docstring for its many limits).

    Precondition: `claims` are the pod's ResourceClaims; already-allocated ones pin the pod to their node.
    """
    nodes = sorted(n["metadata"]["name"] for n in state.objects("Node"))
    pinned = set()
    todo = []
    for c in claims:
        alloc = c.get("status", {}).get("allocation")
        if alloc:
            terms = alloc.get("nodeSelector", {}).get("nodeSelectorTerms", [])
            for t in terms:
                for f in t.get("matchFields", []):
                    pinned.update(f.get("values", []))
        else:
            todo.append(c)
    if pinned:
        nodes = [n for n in nodes if n in pinned]
    slices = state.slices_by_node()
    allocated = state.allocated_devices()
    ns = pod["metadata"].get("namespace", "")
    for node in nodes:
        view = _NodeView(slices.get(node, []), allocated)
        try:
            result = _allocate_on_node(view, todo)
        except CelRuntimeError as err:
            message = nv.cel_runtime_error_message(ns, err.claim, err.selector_index, str(err))
            return Decision.failure(message, reason="SchedulerError")
        if result is not None:
            return Decision.success(node, result)
    total = len(list(state.objects("Node")))
    return Decision.failure(nv.fit_error_message(total, {nv.CANNOT_ALLOCATE: total}))
