"""The per-request part of a result: device groups with counts and reasons, the holders shown (oldest
first), idle bigger MIG slices.
"""

from __future__ import annotations

from claims.diagnosis.analysis import Analysis
from claims.diagnosis.groups import HOLDERS_SHOWN, Group
from claims.diagnosis.requests import Req
from claims.diagnosis.result import ALLOCATED, CAPACITY, COUNTERS, FREE, POOL, SELECTOR, TAINT, Obj
from claims.fleetstate import DeviceInfo, FleetState, claim_results, klog


def _device_desc(info: DeviceInfo) -> str:
    return f"{info.model} {info.profile}".strip() if info.profile else info.model


def group_label(g: Group) -> str:
    return f"{g.model} {g.profile}".strip()


def _holder_entry(state: FleetState, claim: Obj) -> Obj:
    status = claim.get("status") or {}
    pods = [r.get("name", "") for r in status.get("reservedFor") or []]
    return {
        "claim": klog(claim),
        "created": (claim.get("metadata") or {}).get("creationTimestamp") or "",
        "pods": pods,
        "devices": len(claim_results(claim)),
        "reserved": bool(pods),
    }


def _group_reason(g: Group, req: Req) -> str:
    if g.outcomes.get(SELECTOR) and g.miss:
        return f"{g.miss[1]} on {g.outcomes[SELECTOR]} {group_label(g)}"
    parts = []
    for outcome, text in (
        (CAPACITY, "too little capacity for capacity.requests"),
        (POOL, "pool incomplete or invalid"),
        (ALLOCATED, "allocated"),
        (TAINT, "untolerated taint"),
        (COUNTERS, "parent GPU's shared counters used up"),
        (FREE, "free"),
    ):
        if g.outcomes.get(outcome):
            parts.append(f"{g.outcomes[outcome]} {text}")
    return ", ".join(parts)


def request_detail(state: FleetState, a: Analysis) -> Obj:
    groups = []
    for g in sorted(a.groups.values(), key=lambda g: (-g.total, g.model, g.profile)):
        groups.append(
            {
                "model": g.model,
                "profile": g.profile,
                "devices": g.total,
                "matching": g.total - g.outcomes.get(SELECTOR, 0) - g.outcomes.get(CAPACITY, 0),
                "free": g.outcomes.get(FREE, 0),
                "outcomes": dict(g.outcomes),
                "reason": _group_reason(g, a.req),
                "failing_clause": g.miss[0] if g.miss else "",
                "taints": dict(g.taints),
                "pool_problems": sorted(g.pool_problems),
                "max_free_on_one_node": max(g.free_nodes.values(), default=0),
            }
        )
    held = a.ctx.holders_of(a.groups.values())
    every, holders = held.every, held.oldest[:HOLDERS_SHOWN]
    return {
        "name": a.req.name,
        "device_class": a.req.class_name,
        "count": _count_text(a.req),
        "selectors": [s.expression for s in a.req.selectors],
        "matching": a.matching,
        "free": a.count(FREE),
        "groups": groups,
        "holders": [_holder_entry(state, c) for c in holders],
        "holders_total": len(every),
        "idle_bigger_mig": dict(a.fragment_idle),
    }


def _count_text(req: Req) -> int | str:
    """What a request asks for: its count, "All", or a mode this API version does not know (named, not
    shown as a count of 0)."""
    mode = req.spec.get("allocationMode") or "ExactCount"
    if mode == "ExactCount":
        return req.count
    return mode if req.all_mode else f"{mode} (unsupported)"
