"""Seeded random small fleets and claims for the differential test, plus an allocation validator.

Every case is self-contained: 1-2 nodes labelled ``claimscope.test/case=<i>``, their slices, optionally
one pre-allocated (unreserved) claim holding some of their devices, and one claim template whose pod is
pinned to the case's nodes by a nodeSelector. Cases therefore never compete for devices and a whole
batch can be scheduled at once.
"""

from __future__ import annotations

import copy
import random
import uuid
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from claims.cel import CelCompileError, CelRuntimeError, compile_selector, device_view, evaluate
from fleet.quantity import parse_quantity
from simulator import nvidia

Obj = dict[str, Any]
CASE_LABEL = "claimscope.test/case"
GPU = "device.attributes['gpu.nvidia.com']"
CAP = "device.capacity['gpu.nvidia.com']"
MODELS = ("A100", "H100", "H200", "B200")
TAINT = {"key": "nvidia.com/gpu-health", "value": "degraded", "effect": "NoSchedule"}

GPU_SELECTORS = (
    f"{CAP}.memory.compareTo(quantity('40Gi')) >= 0",
    f"{CAP}.memory.compareTo(quantity('100Gi')) >= 0",
    f"{CAP}.memory.compareTo(quantity('150Gi')) >= 0",
    f"{GPU}.productName.matches('H100|B200')",
    f"{GPU}.cudaComputeCapability.compareTo(semver('9.0.0')) >= 0",
    f"{GPU}.architecture == 'Hopper'",
)
MIG_SELECTORS = (
    f"{GPU}.profile.startsWith('1g.')",
    f"{GPU}.profile.startsWith('2g.') || {GPU}.profile.startsWith('3g.')",
    f"{CAP}.memory.compareTo(quantity('20Gi')) >= 0",
    f"{GPU}.productName.matches('H100|H200')",
)
# Full GPUs publish no `profile`: on class gpu.nvidia.com this aborts scheduling (SchedulerError).
ERROR_SELECTOR = f"{GPU}.profile.startsWith('1g.')"
CONSTRAINTS = (
    "gpu.nvidia.com/productName",
    "resource.kubernetes.io/pcieRoot",
    "gpu.nvidia.com/parentUUID",
)


@dataclass
class Case:
    index: int
    nodes: list[Obj]
    slices: list[Obj]
    held: list[Obj]  # results of the pre-allocated claim ({request, driver, pool, device})
    requests: list[Obj]
    constraints: list[Obj] = field(default_factory=list)
    # resource.k8s.io version the template is created with (v1beta1 moves request fields up a level)
    api_version: str = "v1"
    # further claims of the pod (each one template of one request)
    extra_requests: list[Obj] = field(default_factory=list)
    # DRA extended resource: the pod asks for nvidia.com/gpu in its limits instead of a claim
    extended: int = 0
    # DeviceTaintRules (cluster-scoped) over the case's pools, created before its pod
    rules: list[Obj] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"case-{self.index}"

    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.nodes]


def _selectors(rng: random.Random, mig: bool) -> list[str]:
    pool = MIG_SELECTORS if mig else GPU_SELECTORS
    if not mig and rng.random() < 0.04:
        return [ERROR_SELECTOR]
    return rng.sample(pool, rng.choice((0, 0, 1, 1, 2)))


def _spec(rng: random.Random, tolerate: bool) -> tuple[str, int, str, list[str]]:
    mig = rng.random() < 0.4
    mode = "All" if rng.random() < 0.05 else "ExactCount"
    count = rng.choice((1, 1, 1, 2, 2, 3))
    return ("mig.nvidia.com" if mig else "gpu.nvidia.com", count, mode, _selectors(rng, mig))


def _request(rng: random.Random, name: str, tolerate: bool) -> Obj:
    tolerations = [dict(TAINT, operator="Equal")] if tolerate else None
    if rng.random() < 0.3:
        subs = []
        for j in range(rng.choice((2, 3))):
            cls, count, mode, sels = _spec(rng, tolerate)
            sub = nvidia.subrequest(f"s{j}", cls, count, sels, mode)
            if tolerations:
                sub["tolerations"] = tolerations
            subs.append(sub)
        return nvidia.first_available_request(name, subs)
    cls, count, mode, sels = _spec(rng, tolerate)
    # capacity.requests on devices that are not shared: a "has at least this much" filter
    # (upstream structured/internal/incubating/consumable_capacity.go)
    capacity = {"memory": rng.choice(("20Gi", "40Gi", "100Gi"))} if rng.random() < 0.1 else None
    return nvidia.exactly_request(
        name, cls, count, sels, allocation_mode=mode, tolerations=tolerations, capacity=capacity
    )


def _counters(slices: list[Obj]) -> dict[tuple[str, str, str], Fraction]:
    """Shared counters by (pool, counter set, counter)."""
    out: dict[tuple[str, str, str], Fraction] = {}
    for s in slices:
        for cs in s["spec"].get("sharedCounters") or []:
            for name, value in cs["counters"].items():
                out[(s["spec"]["pool"]["name"], cs["name"], name)] = parse_quantity(value["value"]).value
    return out


def _hold(rng: random.Random, slices: list[Obj]) -> list[Obj]:
    """Up to 3 devices that can be allocated together (shared counters respected)."""
    devices = [(s["spec"]["pool"]["name"], d) for s in slices for d in s["spec"].get("devices") or []]
    left = _counters(slices)
    held: list[Obj] = []
    for pool, device in rng.sample(devices, min(len(devices), rng.choice((0, 1, 2, 3)))):
        need = [
            ((pool, use["counterSet"], name), parse_quantity(v["value"]).value)
            for use in device.get("consumesCounters") or []
            for name, v in use["counters"].items()
        ]
        if all(left.get(k, Fraction(0)) >= v for k, v in need):
            for k, v in need:
                left[k] -= v
            held.append(
                {"request": "held", "driver": "gpu.nvidia.com", "pool": pool, "device": device["name"]}
            )
    return held


def make_case(rng: random.Random, index: int, seed: int | None = None, number: int | None = None) -> Case:
    """Case ``index``; with ``seed`` the features added after the first version of the generator are
    drawn from their own stream (seed, index), so the main stream and old cases stay as they were.
    ``number`` renames the case (nodes, label) without changing what it holds."""
    drawn = index
    index = drawn if number is None else number
    nodes: list[Obj] = []
    slices: list[Obj] = []
    tainted = False
    for j in range(rng.choice((1, 1, 2))):
        name = f"d{index}-n{j}"
        model = rng.choice(MODELS)
        gpus = rng.choice((1, 2))
        mode = rng.choice(("full", "full", "static-mig", "dynamic-mig"))
        layout = None
        if mode == "static-mig":
            layout = ",".join(
                rng.choice(("balanced", "all-1g", "all-2g", "all-3g", "full")) for _ in range(gpus)
            )
        taints = {}
        if rng.random() < 0.2:
            taints = {rng.randrange(gpus): [dict(TAINT)]}
            tainted = True
        node = nvidia.node_object(name, model, gpus=gpus, labels={CASE_LABEL: str(index)})
        nodes.append(node)
        node_slices = nvidia.node_slices(name, model, mode=mode, layout=layout, gpus=gpus, taints=taints)
        if rng.random() < 0.08:  # the driver is mid-update: one slice of the pool has not arrived yet
            for s in node_slices:
                s["spec"]["pool"]["resourceSliceCount"] += 1
        slices += node_slices
    first = [s for s in slices if s["spec"]["nodeName"] == nodes[0]["metadata"]["name"]]
    held = _hold(rng, first) if rng.random() < 0.5 else []
    tolerate = tainted and rng.random() < 0.5
    requests = [_request(rng, f"r{k}", tolerate) for k in range(rng.choice((1, 1, 1, 2)))]
    constraints = []
    if rng.random() < 0.2:
        attr = rng.choice(CONSTRAINTS)
        constraints.append({"matchAttribute": attr} if rng.random() < 0.7 else {"distinctAttribute": attr})
    case = Case(index, nodes, slices, held, requests, constraints)
    if seed is not None:
        _more_features(random.Random(f"{seed}/{drawn}"), case, seed, drawn)
    return case


LIST_SELECTORS = (
    f"0 in {GPU}.numaNode",
    f"{GPU}.numaNode.exists(n, n >= 1)",
    "device.driver == 'gpu.nvidia.com'",
)


def _more_features(x: random.Random, case: Case, seed: int, drawn: int) -> None:
    """1.37 features beyond the first generator: list-valued attributes, admin access, several claims per
    pod, DRA extended resources, v1beta1/v1beta2 templates, NoExecute taints, the 32-device limit."""
    if x.random() < 0.1:  # the NVIDIA driver publishes numaNode as a list with DRAListTypeAttributes on
        for s in case.slices:
            for k, d in enumerate(s["spec"].get("devices") or []):
                d.setdefault("attributes", {})["numaNode"] = {"ints": [k % 2, k % 2 + 1]}
        for req in case.requests:
            if req.get("exactly") and x.random() < 0.7:
                req["exactly"].setdefault("selectors", []).append(
                    {"cel": {"expression": x.choice(LIST_SELECTORS)}}
                )
    for s in case.slices:
        for d in s["spec"].get("devices") or []:
            for t in d.get("taints") or []:
                if x.random() < 0.3:
                    t["effect"] = "NoExecute"
    if x.random() < 0.03:  # All over more than 32 MIG devices: the claim limit aborts scheduling
        name = case.nodes[0]["metadata"]["name"]
        model = x.choice(("H100", "H200", "B200"))
        case.nodes[0] = nvidia.node_object(name, model, gpus=5, labels={CASE_LABEL: str(case.index)})
        case.slices = [s for s in case.slices if s["spec"]["nodeName"] != name] + nvidia.node_slices(
            name, model, mode="static-mig", layout="all-1g", gpus=5
        )
        case.held = []
        case.requests = [nvidia.exactly_request("r0", "mig.nvidia.com", allocation_mode="All")]
        case.constraints = []
    roll = x.random()
    if roll < 0.08:
        exact = [r for r in case.requests if r.get("exactly")]
        if exact:
            exact[0]["exactly"]["adminAccess"] = True
    elif roll < 0.16:
        case.extra_requests = [
            nvidia.exactly_request("extra", x.choice(("gpu.nvidia.com", "mig.nvidia.com")), 1)
            for _ in range(x.choice((1, 2)))
        ]
    elif roll < 0.24:
        case.extended = x.choice((1, 1, 2))
    roll = x.random()
    if roll < 0.08:
        case.api_version = "v1beta1"
    elif roll < 0.14:
        case.api_version = "v1beta2"
    # Features added later draw from their own streams, so that the cases above stay as they were found.
    x = random.Random(f"{seed}/{drawn}/shared")
    if x.random() < 0.08:
        _share_devices(x, case)
    x = random.Random(f"{seed}/{drawn}/node-less")
    roll = x.random()
    if roll < 0.09:  # a node-less pool (nodeSelector): on the case's nodes, or (1 in 3) on none
        pool = f"d{case.index}-fabric"
        gpu_model = nvidia.MODELS[x.choice(MODELS)]
        label = str(case.index) if roll < 0.06 else "nowhere"
        selector = {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": CASE_LABEL, "operator": "In", "values": [label]}]}
            ]
        }
        case.slices.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{pool}-0"},
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                    "nodeSelector": selector,
                    "devices": [nvidia.gpu_device(pool, gpu_model, k) for k in range(x.choice((1, 2)))],
                },
            }
        )
    x = random.Random(f"{seed}/{drawn}/taint-rules")
    if x.random() < 0.15:
        _taint_rules(x, case)
    x = random.Random(f"{seed}/{drawn}/binding-conditions")
    if x.random() < 0.08:
        _binding_conditions(x, case)


BINDING = {"bindingConditions": ["example.com/attached"], "bindingFailureConditions": ["example.com/failed"]}


def _binding_conditions(x: random.Random, case: Case) -> None:
    """Binding conditions (DRADeviceBindingConditions, beta, on) on one device or on every device of one of
    the case's pools. Nothing sets the conditions: a pod allocated such a device waits in PreBind, unbound,
    with ``status.nominatedNodeName`` (FINDINGS.md "Binding conditions"), which the test reads as "fits"."""
    pools = sorted({s["spec"]["pool"]["name"] for s in case.slices if s["spec"].get("devices")})
    pool = x.choice(pools)
    devices = [
        d for s in case.slices if s["spec"]["pool"]["name"] == pool for d in s["spec"].get("devices") or []
    ]
    for d in devices if x.random() < 0.7 else [x.choice(devices)]:
        d.update(copy.deepcopy(BINDING))


RULE_TAINT_KEY = "example.com/maintenance"
# Tolerations a request may carry against a rule's taint (upstream resourceclaim.ToleratesTaint): by key,
# by key and value (one of them the wrong value), by key for one effect only, and everything.
RULE_TOLERATIONS: tuple[Obj, ...] = (
    {"key": RULE_TAINT_KEY, "operator": "Exists"},
    {"key": RULE_TAINT_KEY, "operator": "Equal", "value": "planned"},
    {"key": RULE_TAINT_KEY, "operator": "Equal", "value": "urgent"},
    {"key": RULE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    {"key": RULE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"},
    {"operator": "Exists"},
)


def _taint_rules(x: random.Random, case: Case) -> None:
    """1-2 DeviceTaintRules over the case's own pools (NoSchedule, NoExecute or None), and in half of the
    cases tolerations for them on the requests and subrequests.

    Every rule names one of the case's pools (or selects nothing): rules are cluster-scoped and a batch
    shares one cluster, so a rule by driver or device name alone would taint every case's devices. Such
    rules are covered by test_device_taint_rules.py and the unit tests of fleet.taint_rules."""
    pools: dict[str, list[str]] = {}
    for s in case.slices:
        names = [d["name"] for d in s["spec"].get("devices") or []]
        pools.setdefault(s["spec"]["pool"]["name"], []).extend(names)
    for k in range(x.choice((1, 1, 2))):
        pool = x.choice(sorted(pools))
        devices = pools[pool]
        form = x.choice(("pool", "driver+pool", "pool+device", "pool+device", "driver+pool+device", "other"))
        chosen: Obj = {"pool": pool}
        if "driver" in form:
            chosen["driver"] = "gpu.nvidia.com"
        if "device" in form and devices:
            chosen["device"] = x.choice(devices)
        selector: Obj | None = chosen
        if form == "other":  # selects nothing: another driver's pool of that name, or no selector at all
            selector = {"driver": "net.example.com", "pool": pool} if x.random() < 0.5 else None
        taint = {
            "key": RULE_TAINT_KEY,
            "value": x.choice(("planned", "planned", "urgent")),
            "effect": x.choice(("NoSchedule", "NoSchedule", "NoExecute", "NoExecute", "None")),
        }
        name = f"{case.name}-rule-{k}"
        case.rules.append(
            nvidia.device_taint_rule(name, taint, **selector)
            if selector is not None
            else nvidia.device_taint_rule(name, taint, selector=False)
        )
    if x.random() < 0.5:
        for spec in _specs(case):
            if x.random() < 0.8:
                spec["tolerations"] = [*(spec.get("tolerations") or []), dict(x.choice(RULE_TOLERATIONS))]


def _share_devices(x: random.Random, case: Case) -> None:
    """Consumable capacity: the first node's full GPUs (those without counters) allow multiple allocations
    of their memory (1Gi steps), the held devices among them are held as shares, and requests for full GPUs
    ask for some memory."""
    name = case.nodes[0]["metadata"]["name"]
    shared: set[str] = set()
    for s in case.slices:
        if s["spec"].get("nodeName") != name:
            continue
        for d in s["spec"].get("devices") or []:
            if d.get("consumesCounters") or "profile" in (d.get("attributes") or {}):
                continue
            d["allowMultipleAllocations"] = True
            d["capacity"]["memory"]["requestPolicy"] = {
                "default": "10Gi",
                "validRange": {"min": "1Gi", "step": "1Gi"},
            }
            shared.add(d["name"])
    for h in case.held:
        if h["device"] in shared:
            h["shareID"] = str(uuid.UUID(int=x.getrandbits(128), version=4))
            h["consumedCapacity"] = {"memory": x.choice(("10Gi", "40Gi", "70Gi"))}
    for req in case.requests:
        exact = req.get("exactly") or {}
        if exact.get("deviceClassName") == "gpu.nvidia.com" and x.random() < 0.7:
            exact["capacity"] = {"requests": {"memory": x.choice(("5Gi", "20Gi", "40Gi", "75Gi"))}}


def as_api_version(template: Obj, version: str) -> Obj:
    """``template`` (v1 shape) as ``resource.k8s.io/<version>`` would take it."""
    out = copy.deepcopy(template)
    out["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        for req in out["spec"]["spec"]["devices"]["requests"]:
            req.update(req.pop("exactly", {}))
    return out


def _specs(case: Case) -> list[Obj]:
    out: list[Obj] = []
    for req in case.requests:
        out += req.get("firstAvailable") or [req.get("exactly") or {}]
    return out


def case_features(case: Case) -> set[str]:
    """What a case exercises, for the per-feature agreement figures."""
    specs = _specs(case)
    devices = [d for s in case.slices for d in s["spec"].get("devices") or []]
    found = {"all"}
    checks = {
        "list-attributes": any("numaNode" in (d.get("attributes") or {}) for d in devices),
        "no-execute-taint": any(
            t.get("effect") == "NoExecute" for d in devices for t in d.get("taints") or []
        ),
        "claim-limit": any(
            sum(len(s["spec"].get("devices") or []) for s in case.slices if s["spec"].get("nodeName") == n)
            > 32
            for n in case.node_names()
        )
        and any(s.get("allocationMode") == "All" for s in specs),
        "several-claims": bool(case.extra_requests),
        "shared-device": any(d.get("allowMultipleAllocations") for d in devices),
        "node-less-pool": any(not s["spec"].get("nodeName") for s in case.slices),
        "extended-resource": case.extended > 0,
        "binding-conditions": any(d.get("bindingConditions") for d in devices),
        "taint-rule": any(_rule_taints(case.rules, case.slices).values()),
        "taint-rule-no-execute": any(
            t["effect"] == "NoExecute" for ts in _rule_taints(case.rules, case.slices).values() for t in ts
        ),
        "taint-rule-none": any(
            t["effect"] == "None" for ts in _rule_taints(case.rules, case.slices).values() for t in ts
        ),
        "taint-rule-selects-nothing": bool(case.rules)
        and not any(_rule_taints(case.rules, case.slices).values()),
        "rule-tolerated": any(
            _tolerates(x, t)
            for s in specs
            for x in s.get("tolerations") or []
            for ts in _rule_taints(case.rules, case.slices).values()
            for t in ts
        ),
        f"api-{case.api_version}": True,
        "first-available": any(r.get("firstAvailable") for r in case.requests),
        "all-mode": any(s.get("allocationMode") == "All" for s in specs),
        "capacity-request": any(s.get("capacity") for s in specs),
        "admin-access": any(s.get("adminAccess") for s in specs),
        "selector-error": any(ERROR_SELECTOR in str(s.get("selectors")) for s in specs),
        "constraint": bool(case.constraints),
        "held": bool(case.held),
        "two-nodes": len(case.nodes) > 1,
        "taint": any(d.get("taints") for d in devices),
        "tolerated": any(s.get("tolerations") for s in specs),
        "mig": any("profile" in (d.get("attributes") or {}) for d in devices),
        "partitionable": any(d.get("consumesCounters") for d in devices),
        "incomplete-pool": any(
            sum(1 for t in case.slices if t["spec"]["pool"]["name"] == s["spec"]["pool"]["name"])
            != s["spec"]["pool"]["resourceSliceCount"]
            for s in case.slices
        ),
        "two-requests": len(case.requests) > 1,
    }
    return found | {name for name, on in checks.items() if on}


# ------------------------------------------------------------------------------------------ validator


def _matches(expr: str, driver: str, device: Obj) -> bool:
    try:
        return evaluate(compile_selector(expr), device_view(driver, device))
    except (CelCompileError, CelRuntimeError):
        return False


def _attr(device: Obj, name: str, driver: str) -> object:
    attrs = device.get("attributes") or {}
    domain, _, ident = name.partition("/")
    raw = attrs.get(name) or (attrs.get(ident) if domain == driver else None)
    return tuple(sorted(raw.items())) if raw else None


def _rule_taints(rules: list[Obj], slices: list[Obj]) -> dict[tuple[str, str, str], list[Obj]]:
    """The taints ``rules`` add, by device (driver, pool, name), written from the API's definition of
    DeviceTaintSelector (each of driver, pool, device must equal the device's when set; no selector
    selects nothing), independently of fleet.taint_rules."""
    out: dict[tuple[str, str, str], list[Obj]] = {}
    for rule in rules:
        sel = rule["spec"].get("deviceSelector")
        if sel is None:
            continue
        for s in slices:
            driver, pool = s["spec"]["driver"], s["spec"]["pool"]["name"]
            for d in s["spec"].get("devices") or []:
                wanted = (sel.get("driver"), sel.get("pool"), sel.get("device"))
                if all(w is None or w == v for w, v in zip(wanted, (driver, pool, d["name"]), strict=True)):
                    out.setdefault((driver, pool, d["name"]), []).append(rule["spec"]["taint"])
    return out


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    """k8s.io/dynamic-resource-allocation/resourceclaim.ToleratesTaint."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def validate_allocation(
    allocation: Obj,
    requests: list[Obj],
    constraints: list[Obj],
    slices: list[Obj],
    classes: list[Obj],
    held: list[Obj],
    rules: list[Obj] | None = None,
) -> list[str]:
    """Problems with ``allocation`` (a claim's ``status.allocation``); empty when it is valid.

    Checked independently of the allocator: devices exist and are distinct, not held by another claim,
    match class + request selectors, tolerate taints (their own and those of DeviceTaintRules), fit shared
    counters, counts per request (or the chosen subrequest) are exact, and matchAttribute/distinctAttribute
    hold."""
    problems: list[str] = []
    devices = {
        (s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]): d
        for s in slices
        for d in s["spec"].get("devices") or []
    }
    class_exprs = {
        c["metadata"]["name"]: [x["cel"]["expression"] for x in c["spec"].get("selectors") or []]
        for c in classes
    }
    added = _rule_taints(rules or [], slices)
    taken = {(h["driver"], h["pool"], h["device"]) for h in held if not h.get("shareID")}
    results = allocation.get("devices", {}).get("results") or []
    keys = [(r["driver"], r["pool"], r["device"]) for r in results]
    shareable = {k for k in keys if (devices.get(k) or {}).get("allowMultipleAllocations")}
    if len({k for k in keys if k not in shareable}) != len([k for k in keys if k not in shareable]):
        problems.append("a device is allocated twice")
    # adminAccess results may name devices that other claims hold
    owned = {
        k for r, k in zip(results, keys, strict=True) if not r.get("adminAccess") and not r.get("shareID")
    }
    if taken & owned:
        problems.append(f"devices already held by another claim: {sorted(taken & owned)}")
    specs: dict[str, Obj] = {}
    for req in requests:
        if req.get("firstAvailable"):
            for sub in req["firstAvailable"]:
                specs[f"{req['name']}/{sub['name']}"] = sub
        else:
            specs[req["name"]] = req["exactly"]
    per_request: dict[str, int] = {}
    left = _counters(slices)
    for h in held:
        for use in devices[(h["driver"], h["pool"], h["device"])].get("consumesCounters") or []:
            for name, v in use["counters"].items():
                left[(h["pool"], use["counterSet"], name)] -= parse_quantity(v["value"]).value
    for r, key in zip(results, keys, strict=True):
        device = devices.get(key)
        spec = specs.get(r["request"])
        if device is None or spec is None:
            problems.append(f"unknown device or request in {r}")
            continue
        per_request[r["request"]] = per_request.get(r["request"], 0) + 1
        exprs = class_exprs[spec["deviceClassName"]] + [
            s["cel"]["expression"] for s in spec.get("selectors") or []
        ]
        if not all(_matches(e, key[0], device) for e in exprs):
            problems.append(f"{key} does not match the selectors of {r['request']}")
        tolerations = spec.get("tolerations") or []
        for t in [*(device.get("taints") or []), *added.get(key, [])]:
            if t.get("effect") in ("NoSchedule", "NoExecute") and not any(
                _tolerates(x, t) for x in tolerations
            ):
                problems.append(f"{key} has an untolerated taint {t}")
        for use in device.get("consumesCounters") or []:
            for name, v in use["counters"].items():
                left[(key[1], use["counterSet"], name)] -= parse_quantity(v["value"]).value
    if any(v < 0 for v in left.values()):
        problems.append("shared counters over-consumed")
    for req in requests:
        chosen = [k for k in per_request if k == req["name"] or k.startswith(req["name"] + "/")]
        if len(chosen) != 1:
            problems.append(f"request {req['name']}: results for {chosen}")
            continue
        spec = specs[chosen[0]]
        if (spec.get("allocationMode") or "ExactCount") == "ExactCount" and per_request[
            chosen[0]
        ] != spec.get("count", 1):
            problems.append(
                f"request {chosen[0]}: {per_request[chosen[0]]} devices, want {spec.get('count', 1)}"
            )
    for c in constraints:
        attr = str(c.get("matchAttribute") or c.get("distinctAttribute"))
        values = [_attr(devices[k], attr, k[0]) for k in keys if k in devices]
        if any(v is None for v in values):
            problems.append(f"a device lacks constraint attribute {attr}")
        elif c.get("matchAttribute") and len(set(values)) > 1:
            problems.append(f"matchAttribute {attr} violated")
        elif c.get("distinctAttribute") and len(set(values)) != len(values):
            problems.append(f"distinctAttribute {attr} violated")
    return problems
