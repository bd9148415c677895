"""Per-request analysis: every device through the allocator's checks in its order (selector, capacity,
pool, allocated, taint, counters), counted per candidate group, with what each group misses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from claims.allocator import policy_amount
from claims.cel import CelRuntimeError
from claims.diagnosis.groups import Context, Group, Part, Summary, shares_of, summary_key
from claims.diagnosis.matching import explain_miss, selector_matches
from claims.diagnosis.requests import Req, untolerated_taints
from claims.diagnosis.result import ALLOCATED, CAPACITY, COUNTERS, ERROR, FREE, POOL, SELECTOR, TAINT, Obj
from claims.fleetstate import DeviceInfo, DeviceKey
from fleet.normalize import mig_compute_slices
from fleet.quantity import parse_quantity
from fleet.taint_rules import rule_text


@dataclass
class Analysis:
    ctx: Context
    req: Req
    groups: dict[tuple[str, str], Group] = field(default_factory=dict)
    error: str = ""
    error_device: str = ""
    error_selector: str = ""
    error_nodes: set[str] = field(default_factory=set)
    free_by_node: dict[str, int] = field(default_factory=dict)
    candidate_nodes: set[str] = field(default_factory=set)  # a matching device, any state
    fragment_idle: dict[str, int] = field(default_factory=dict)  # idle bigger MIG slices by profile
    free: list[DeviceInfo] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(g.outcomes.get(outcome, 0) for g in self.groups.values())

    @property
    def matching(self) -> int:
        return sum(g.total for g in self.groups.values()) - self.count(SELECTOR) - self.count(CAPACITY)

    @property
    def needed(self) -> int:
        return max(self.req.count, 1)


_CLASS_MISS = "class"


def _selector_outcome(ctx: Context, req: Req, info: DeviceInfo) -> tuple[str, int, CelRuntimeError | None]:
    """(outcome, selectors evaluated, error): class selectors first, then the request's (``isSelectable``)."""
    evaluated = 0
    try:
        for s in req.class_selectors:
            evaluated += 1
            if not selector_matches(ctx.state, s, info):
                return _CLASS_MISS, evaluated, None
        for s in req.selectors:
            evaluated += 1
            if not selector_matches(ctx.state, s, info):
                return SELECTOR, evaluated, None
    except CelRuntimeError as exc:
        # Kept in the analysis: without its traceback, which would hold every frame up the stack.
        return ERROR, evaluated, exc.with_traceback(None)
    return FREE, evaluated, None


def analyze(ctx: Context, req: Req, nodes: set[str] | None) -> Analysis:
    """Walk the fleet once (allocator check order) and group the outcome by model x profile.

    Devices with one signature (same low-cardinality attributes and capacities) share the selector
    outcome when no selector reads a high-cardinality attribute: one representative is evaluated."""
    out = Analysis(ctx, req)
    state = ctx.state
    holders = state.holders()
    high = state.high_cardinality
    shared = all(not s.opaque and not (s.references & high) for s in (*req.class_selectors, *req.selectors))
    idle: list[list[DeviceInfo]] = []
    # Which part of a signature group a batch is, for the per-state caches of summaries and splits: the
    # whole group (None), the devices on the pod's nodes, or the devices split off as skipped from either
    # (when some remain). Two pods' node sets can leave parts of one group of the same size, first and
    # last device.
    on_nodes = frozenset(nodes) if nodes is not None else None
    for members in state.signature_groups():
        part: Part = None
        if on_nodes is not None:
            kept = [i for i in members if not i.node or i.node in on_nodes]
            if len(kept) < len(members):
                members, part = kept, on_nodes
        if not members:
            continue
        batches = [members] if shared else [[i] for i in members]
        for batch in batches:
            rep = batch[0]
            outcome, evaluated, error = _selector_outcome(ctx, req, rep)
            state.saved += evaluated * (len(batch) - 1)
            if error is not None and not req.all_mode and not req.admin:
                # The allocator skips devices in use and pools it cannot use before evaluating selectors.
                skipped, batch = ctx.split_skipped(batch, part)
                if skipped:
                    # Skipped whole (a group all in use, most of them under churn), the batch is the part
                    # it was split from, whose summary another request likely made already: keyed as that
                    # part, it is walked once per state, not twice.
                    _record(ctx, req, out, skipped, FREE, holders, idle, ("skipped", part) if batch else part)
                    if not batch:
                        continue
                    rep = batch[0]  # the rest only names where the error is: it is never summarized
            if error is not None:
                out.error_nodes.update(i.node for i in batch)
                if not out.error:
                    out.error = error.message
                    out.error_device = "/".join(rep.key)
                    out.error_selector = error.expression
                continue
            if outcome == _CLASS_MISS:
                if rep.profile:
                    idle.append(batch)
                continue
            _record(ctx, req, out, batch, outcome, holders, idle, part)
    if out.count(FREE) < out.needed and any(g.profile for g in out.groups.values()):
        wanted = max(
            (
                mig_compute_slices(g.profile)
                for g in out.groups.values()
                if g.profile and g.total > g.outcomes.get(SELECTOR, 0) + g.outcomes.get(CAPACITY, 0)
            ),
            default=0,
        )
        for batch in idle:
            for info in batch:
                if (
                    mig_compute_slices(info.profile) > wanted
                    and not holders.get(info.key)
                    and ctx.counters_fit(info)
                ):
                    out.fragment_idle[info.profile] = out.fragment_idle.get(info.profile, 0) + 1
    return out


def _record(
    ctx: Context,
    req: Req,
    out: Analysis,
    batch: list[DeviceInfo],
    outcome: str,
    holders: dict[DeviceKey, list[Obj]],
    idle: list[list[DeviceInfo]],
    part: Part,
) -> None:
    rep = batch[0]
    group = out.groups.setdefault((rep.model, rep.profile), Group(rep.model, rep.profile))
    group.total += len(batch)
    if outcome == SELECTOR:
        group.outcomes[SELECTOR] = group.outcomes.get(SELECTOR, 0) + len(batch)
        if rep.profile:
            idle.append(batch)
        if group.miss is None and req.selectors:
            if len(req.selectors) == 1:
                group.miss = explain_miss(rep, req.selectors[0].expression)
            else:
                group.miss = explain_miss(rep, " && ".join(f"({s.expression})" for s in req.selectors))
        return
    if req.capacity or len(batch) == 1:
        summary = summarize(ctx, req, batch, holders)
    else:  # a signature group's part: the outcome depends only on the fleet state and the tolerations
        key = summary_key(batch, req, part)
        cached = ctx.summaries.get(key)
        if cached is None:
            cached = ctx.summaries[key] = summarize(ctx, req, batch, holders)
        summary = cached
    for outcome_name, n in summary.outcomes.items():
        group.outcomes[outcome_name] = group.outcomes.get(outcome_name, 0) + n
    for node_name, n in summary.free_nodes.items():
        group.free_nodes[node_name] = group.free_nodes.get(node_name, 0) + n
        out.free_by_node[node_name] = out.free_by_node.get(node_name, 0) + n
    for label, n in summary.taints.items():
        group.taints[label] = group.taints.get(label, 0) + n
    if summary.holders:
        group.sources.append(summary)
    group.pool_problems |= summary.pool_problems
    out.candidate_nodes |= summary.candidate_nodes
    out.free.extend(summary.free)


def summarize(
    ctx: Context, req: Req, batch: list[DeviceInfo], holders: dict[DeviceKey, list[Obj]]
) -> Summary:
    """The state outcomes of ``batch`` (each device's ``_state_outcome``), counted."""
    summary = Summary()
    scratch = Group("", "")
    outcomes, free, free_nodes, candidates = (
        summary.outcomes,
        summary.free,
        summary.free_nodes,
        summary.candidate_nodes,
    )
    # This loop runs over every device of the fleet for each state (a fifth of an update at L). When the
    # request asks for no capacity and no pool has a problem, the two commonest devices skip the call:
    # one held whole (allocated) and one held by nobody, untainted, whose counters nobody consumes (free).
    plain = not req.capacity and not ctx.pool_problem
    in_use = {} if req.admin else holders
    counted = bool(ctx.used_sets)
    held_by = scratch.holders
    for info in batch:
        if plain:
            device = info.device
            held = in_use.get(info.key)
            if held and not device.get("allowMultipleAllocations"):
                for claim in held:
                    held_by[id(claim)] = claim  # the state holds the claim: its id is not reused
                result = ALLOCATED
            elif not held and not device.get("taints") and not (counted and device.get("consumesCounters")):
                result = FREE
            else:
                result = _state_outcome(ctx, req, info, scratch, holders)
        else:
            result = _state_outcome(ctx, req, info, scratch, holders)
        outcomes[result] = outcomes.get(result, 0) + 1
        if result == FREE:
            free.append(info)
            node = info.node
            free_nodes[node] = free_nodes.get(node, 0) + 1
            candidates.add(node)
        elif result != SELECTOR and result != CAPACITY:
            candidates.add(info.node)
    summary.taints, summary.holders, summary.pool_problems = (
        scratch.taints,
        scratch.holders,
        scratch.pool_problems,
    )
    return summary


def _capacity_left(req: Req, info: DeviceInfo, shares: list[Obj]) -> str:
    """CAPACITY when the device cannot serve the request at all (missing capacity, over its
    requestPolicy), ALLOCATED when its shares leave too little, else FREE (``_capacity_for``)."""
    caps = info.device.get("capacity") or {}
    if any(name not in caps for name in req.capacity):
        return CAPACITY
    shareable = bool(info.device.get("allowMultipleAllocations"))
    for name, cap in caps.items():
        if not shareable and name not in req.capacity:
            continue
        total = parse_quantity(str((cap or {}).get("value", "0"))).value
        amount = policy_amount(req.capacity.get(name), cap or {}, total)
        if amount is None or amount > total:
            return CAPACITY
        used = sum(
            (parse_quantity(str((r.get("consumedCapacity") or {}).get(name, "0"))).value for r in shares),
            Fraction(0),
        )
        if used + amount > total:
            return ALLOCATED
    return FREE


def _state_outcome(
    ctx: Context, req: Req, info: DeviceInfo, group: Group, holders: dict[DeviceKey, list[Obj]]
) -> str:
    if req.capacity and _capacity_left(req, info, []) == CAPACITY:
        return CAPACITY
    problem = ctx.pool_problem.get((info.key[0], info.key[1]))
    if problem:
        group.pool_problems.add(problem)
        return POOL
    held = None if req.admin else holders.get(info.key)
    if held:
        shares = shares_of(info, held)
        if shares is None or _capacity_left(req, info, shares) != FREE:
            for claim in held:
                group.holders[id(claim)] = claim  # the state holds the claim: its id is not reused
            return ALLOCATED
    untolerated = untolerated_taints(info.device, req.tolerations)
    if untolerated:
        for t in untolerated:
            label = f"{t.get('key', '')}={t.get('value', '')}:{t.get('effect', '')}{rule_text(t)}"
            group.taints[label] = group.taints.get(label, 0) + 1
        return TAINT
    if not ctx.counters_fit(info):
        return COUNTERS
    return FREE
