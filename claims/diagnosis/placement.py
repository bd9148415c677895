"""Where a claim could go: the nodes its pod may use, the allocator replay on them (``claims.allocator``),
the invalid pools there, and the ``fits`` result with its placement.
"""

from __future__ import annotations

from claims.allocator import AllocationResult, allocate
from claims.diagnosis.analysis import Analysis
from claims.diagnosis.groups import Context
from claims.diagnosis.result import Diagnosis, Obj
from claims.fleetstate import FleetState, klog


def scheduled_message(pod: Obj | None) -> str:
    for cond in ((pod or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message", ""))
    return ""


def pod_as_read(pod: Obj) -> Obj:
    """What a claim's diagnosis reads of the pod using it, as a pod: its namespace and name, its node
    selector and the scheduler's message (``scheduled_message``). The claim is diagnosed the same with this
    pod as with the whole one; pods alike in it share a diagnosis (``claims.tasks.Shapes``)."""
    meta = pod.get("metadata") or {}
    out: Obj = {
        "kind": "Pod",
        "metadata": {"namespace": meta.get("namespace", ""), "name": meta.get("name", "")},
    }
    selector = (pod.get("spec") or {}).get("nodeSelector")
    if selector:
        out["spec"] = {"nodeSelector": selector}
    message = scheduled_message(pod)
    if message:
        out["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "message": message}]}
    return out


def pod_nodes(state: FleetState, pod: Obj | None) -> set[str] | None:
    selector = ((pod or {}).get("spec") or {}).get("nodeSelector") or {}
    if not selector:
        return None
    out = set()
    for node in state.objects["Node"]:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if all(labels.get(k) == v for k, v in selector.items()):
            out.add(str((node.get("metadata") or {}).get("name", "")))
    return out


def place(
    state: FleetState, claims: list[Obj], analyses: list[list[Analysis]], nodes: set[str] | None
) -> tuple[str | None, AllocationResult | None, int]:
    """(node, result, nodes tried). Error first (any node that hits a CEL error aborts the attempt, as in
    the scheduler's parallel Filter), then the first node in name order where the replay succeeds.
    Nodes where some request has too few free devices are skipped: the allocator cannot succeed there."""
    all_nodes = [n for n in state.node_names() if nodes is None or n in nodes]
    error_nodes = {n for group in analyses for a in group for n in a.error_nodes}
    # Devices from node-less slices (allNodes, nodeSelector) may serve any node: no pruning then.
    node_less = "" in error_nodes or any(
        "" in a.free_by_node or "" in a.candidate_nodes for group in analyses for a in group
    )
    if "" in error_nodes:
        error_nodes = set(all_nodes)
    candidates: set[str] | None = None
    # All mode can fail fatally on any node (incomplete pool, constraint): never prune it.
    all_mode = any(a.req.all_mode for group in analyses for a in group)
    if len(claims) == 1 and not node_less and not all_mode:
        for alternatives in analyses:
            possible: set[str] = set()
            for a in alternatives:
                possible |= {n for n, free in a.free_by_node.items() if free >= a.needed}
            candidates = possible if candidates is None else candidates & possible
    snapshot = state.snapshot
    tried = 0
    fits: dict[str, AllocationResult] = {}
    for node in sorted(error_nodes & set(all_nodes)):
        tried += 1
        result = allocate(claims, node, snapshot)
        if result.kind == "error":
            return None, result, tried
        if result.ok:
            fits[node] = result
    order = all_nodes if candidates is None else sorted(candidates & set(all_nodes))
    for node in order:
        # With an All request every node is tried: one can fail fatally (incomplete pool, more than 32
        # devices) after another fits, and the scheduler's parallel Filter aborts then.
        if fits and node > min(fits) and not all_mode:
            break
        if node in error_nodes:
            continue
        tried += 1
        result = allocate(claims, node, snapshot)
        if result.kind == "error":
            return None, result, tried
        if result.ok:
            fits[node] = result
            if not all_mode:
                break
    if fits:
        first = min(fits)
        return first, fits[first], tried
    return None, None, tried


def invalid_pools(state: FleetState, ctx: Context, nodes: set[str] | None) -> list[str]:
    """Problems of invalid pools with devices on the nodes the pod may use (all nodes when None)."""
    where = _invalid_pool_nodes(state, ctx)
    return sorted(p for p, on in where.items() if nodes is None or "" in on or on & nodes)


def _invalid_pool_nodes(state: FleetState, ctx: Context) -> dict[str, set[str]]:
    """Each invalid pool's problem -> the nodes of its devices ("" for node-less ones); once per state
    (every unschedulable claim asks, and walking every device per claim cost most of a recompute)."""
    cached: dict[str, set[str]] | None = ctx.__dict__.get("_invalid_pool_nodes")
    if cached is not None:
        return cached
    invalid = {pool: p for pool, p in ctx.pool_problem.items() if " is invalid: " in p}
    found: dict[str, set[str]] = {}
    if invalid:
        for info in state.devices():
            problem = invalid.get((info.key[0], info.key[1]))
            if problem:
                found.setdefault(problem, set()).add(info.node)
    ctx.__dict__["_invalid_pool_nodes"] = found
    return found


def fits_diagnosis(
    state: FleetState, base: Diagnosis, claim: Obj, pod: Obj | None, node: str, result: AllocationResult
) -> Diagnosis:
    devices = []
    for r in ((result.allocations.get(klog(claim)) or {}).get("devices") or {}).get("results") or []:
        info = state.device((r["driver"], r["pool"], r["device"]))
        devices.append({**r, "model": info.model if info else "", "profile": info.profile if info else ""})
    base.category = "fits"
    base.placement = {"node": node, "devices": devices, "allocation": result.allocations.get(klog(claim))}
    counts: dict[str, int] = {}
    for d in devices:
        label = f"{d['model']} {d['profile']}".strip()
        counts[label] = counts.get(label, 0) + 1
    what = ", ".join(f"{n} x {label}" for label, n in counts.items())
    names = ", ".join(d["device"] for d in devices[:6]) + (", …" if len(devices) > 6 else "")
    base.summary = f"Fits now on node {node}: {what} ({names})."
    message = scheduled_message(pod)
    if pod is None:
        if (claim.get("metadata") or {}).get("uid"):
            base.summary += (
                " Still pending because no pod uses it: claims are allocated when a pod using them is "
                "scheduled."
            )
            base.suggestions = ["Create a pod that references this claim."]
    elif message and "cannot allocate all claims" not in message and "DynamicResources" not in message:
        base.summary += f" Still pending for a non-DRA reason: {message}"
        base.suggestions = ["Fix the pod's other scheduling constraint (see the scheduler's message)."]
        base.scheduler_message = message
    else:
        base.summary += (
            " The scheduler has not retried since the fleet changed; it will on the next fleet event."
        )
        base.scheduler_message = message
        base.suggestions = [
            "Wait for the scheduler's next attempt (it retries with backoff, up to about 5 minutes)."
        ]
    return base
