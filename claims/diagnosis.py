"""Why is this claim pending, and will this claim fit? (issue 8; dra-reference §5, §8)

``diagnose(state, obj)`` takes a ResourceClaim, a ResourceClaimTemplate or a Pod (as dicts) and a
:class:`~claims.fleetstate.FleetState`, and returns a :class:`Diagnosis`: a ``category``, a one-line
``summary`` for the on-call engineer, per-request device groups (model x MIG profile) with how many devices
each stage of the allocator rejected and why, the claims holding matching devices (oldest first), the
``placement`` the allocator replay would choose, ``lint`` findings and ``suggestions``.

The verdict "fits / does not fit" always comes from the allocator replay (``claims.allocator``), run on the
nodes where the claim could possibly fit; the per-device pass only explains it. Selector results are
shared between devices with the same projection of the attributes a selector reads (``FleetState.results``).
"""

from __future__ import annotations

import copy
import heapq
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from claims.allocator import MAX_RESULTS, AllocationResult, allocate, policy_amount
from claims.cel import (
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    compile_selector,
    device_view,
    evaluate,
)
from claims.fleetstate import DeviceInfo, DeviceKey, FleetState, claim_results, klog
from claims.lint import Finding, lint_object, published_names
from fleet.normalize import claim_as_v1, mig_compute_slices, unsupported_api_version
from fleet.quantity import QuantityError, parse_quantity

Obj = dict[str, Any]

CATEGORIES = (
    "fits",
    "capacity",
    "no-match",
    "fragmentation",
    "constraint",
    "taint",
    "pool",
    "class-missing",
    "cel-error",
    "too-many",
    "not-created",
    "unsupported",
)
NO_SUCH_KEY_HINT = (
    ". consider using CEL optional chaining (.? followed by orValue()) or guarding the check with has() "
    "for optional fields"
)

# Per-device outcome of one (sub)request, in the allocator's order of checks.
SELECTOR, CAPACITY, POOL, ALLOCATED, TAINT, COUNTERS, FREE, ERROR = (
    "selector",
    "capacity",
    "pool",
    "allocated",
    "taint",
    "counters",
    "free",
    "cel-error",
)


@dataclass
class Diagnosis:
    """The result object of ``explain``, ``POST /api/v1/whatif`` and ``/claims/{id}/diagnosis``."""

    category: str
    summary: str
    requests: list[Obj] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    placement: Obj | None = None
    lint: list[Obj] = field(default_factory=list)
    claim: str = ""
    pod: str = ""
    scheduler_message: str = ""

    def as_dict(self) -> Obj:
        return asdict(self)


# ----------------------------------------------------------------------------------------- selectors


def _raw_projection(info: DeviceInfo, selector: CompiledSelector) -> Any:
    """What ``selector`` reads from ``info.device`` in raw form; equal projections ⇒ equal results."""
    if selector.opaque:
        return ("device", info.key)
    driver = info.key[0]
    attrs = info.device.get("attributes") or {}
    caps = info.device.get("capacity") or {}
    values: list[Any] = [
        driver if selector.reads_driver else None,
        info.device.get("allowMultipleAllocations"),
    ]
    for kind, domain, name in sorted(selector.references):
        source = attrs if kind == "attributes" else caps
        raw = source.get(f"{domain}/{name}")
        if raw is None and domain == driver:
            raw = source.get(name)
        values.append(_hashable(raw))
    return tuple(values)


def _hashable(raw: Any) -> Any:
    """A raw attribute or capacity as a cache key (list-valued attributes hold lists)."""
    if isinstance(raw, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in raw.items()))
    if isinstance(raw, list):
        return tuple(_hashable(v) for v in raw)
    return raw


def _match(state: FleetState, selector: CompiledSelector, info: DeviceInfo) -> bool:
    """Selector result for a device, shared across identical projections. Raises CelRuntimeError."""
    cache_key = (selector.expression, _raw_projection(info, selector))
    found = state.results.get(cache_key)
    if found is None:
        state.evaluations += 1
        try:
            found = evaluate(selector, device_view(info.key[0], info.device))
        except CelRuntimeError as exc:
            found = exc.message
        state.results[cache_key] = found
    else:
        state.saved += 1
    if isinstance(found, str):
        raise CelRuntimeError(selector.expression, found)
    return found


def split_conjuncts(expression: str) -> list[str]:
    """Top-level ``&&`` operands of a CEL expression (quotes and brackets respected)."""
    parts: list[str] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(expression):
        ch = expression[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and expression.startswith("&&", i):
            parts.append(expression[start:i].strip())
            start = i + 2
            i += 1
        i += 1
    parts.append(expression[start:].strip())
    return [p for p in parts if p]


_QUANTITY_LITERAL = re.compile(r"quantity\(\s*['\"]([^'\"]+)['\"]\s*\)")


def _human_quantity(raw: str) -> str:
    try:
        value = parse_quantity(raw).value
    except QuantityError:
        return raw
    gib = value / (1 << 30)
    if value >= (1 << 30):
        return f"{float(gib):.0f}Gi" if gib.denominator == 1 or gib > 10 else f"{float(gib):.1f}Gi"
    return raw


def _raw_value(info: DeviceInfo, kind: str, domain: str, name: str) -> str | None:
    source = info.device.get(kind) or {}
    raw = source.get(f"{domain}/{name}")
    if raw is None and domain == info.key[0]:
        raw = source.get(name)
    if not isinstance(raw, dict):
        return None
    if kind == "capacity":
        return _human_quantity(str(raw.get("value", "")))
    return str(next(iter(raw.values()), ""))


_COMPARED = re.compile(r"""\.(\w+)\s*(==|!=|in)\s*('[^']*'|"[^"]*"|\[[^\]]*\])""")


def _wanted(clause: str, name: str) -> str:
    """What a clause compares attribute ``name`` with, as the miss states it: `` != '1g.10gb'`` or
    `` not in ['a', 'b']`` (the device's value alone, "profile '1g.10gb+me'", says nothing of the want)."""
    for attribute, op, literal in _COMPARED.findall(clause):
        if attribute == name:
            return {"==": f" != {literal}", "!=": f" == {literal}", "in": f" not in {literal}"}[op]
    return ""


def explain_miss(info: DeviceInfo, expression: str) -> tuple[str, str]:
    """(failing clause, values) for a device a request selector rejects, e.g. ("…", "memory 80Gi < 150Gi")."""
    for clause in split_conjuncts(expression):
        try:
            selector = compile_selector(clause)
            ok = evaluate(selector, device_view(info.key[0], info.device))
        except (CelCompileError, CelRuntimeError) as exc:
            return clause, exc.message
        if ok:
            continue
        values = []
        for kind, domain, name in sorted(selector.references):
            value = _raw_value(info, kind, domain, name)
            literal = _QUANTITY_LITERAL.search(clause)
            if kind == "capacity" and value is not None and literal:
                have = parse_quantity(
                    str((info.device.get("capacity") or {}).get(name, {}).get("value", "0"))
                )
                want = parse_quantity(literal.group(1))
                op = "<" if have.value < want.value else (">" if have.value > want.value else "=")
                values.append(f"{name} {value} {op} {_human_quantity(literal.group(1))}")
            elif value is None:
                values.append(f"{name} not published")
            else:
                values.append(f"{name} {value!r}{_wanted(clause, name)}")
        return clause, ", ".join(values) or "false"
    return expression, "false"


# ------------------------------------------------------------------------------------- request specs


@dataclass
class _Req:
    name: str  # "req" or "req/sub"
    parent: str
    spec: Obj
    class_name: str
    count: int
    all_mode: bool
    selectors: list[CompiledSelector]
    class_selectors: list[CompiledSelector]
    tolerations: list[Obj]
    capacity: dict[str, Fraction]
    admin: bool = False  # adminAccess: existing allocations do not count (taints and counters do)


def _requests_of(claim: Obj) -> list[list[Obj]]:
    """Per spec request, [(name, spec)] alternatives: one for ``exactly``, several for ``firstAvailable``."""
    out: list[list[Obj]] = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = request.get("name", "")
        if request.get("firstAvailable"):
            out.append(
                [
                    {"name": f"{name}/{s.get('name', '')}", "parent": name, "spec": s}
                    for s in request["firstAvailable"]
                ]
            )
        else:
            out.append([{"name": name, "parent": name, "spec": request.get("exactly") or {}}])
    return out


def _selectors(spec: Obj) -> list[str]:
    return [((s or {}).get("cel") or {}).get("expression", "") for s in spec.get("selectors") or []]


def _claim_from(obj: Obj) -> Obj:
    if obj.get("kind") == "ResourceClaimTemplate":
        meta = obj.get("metadata") or {}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": meta.get("namespace", "default"), "name": meta.get("name", "template")},
            "spec": copy.deepcopy((obj.get("spec") or {}).get("spec") or {}),
        }
    claim = copy.deepcopy(obj)
    claim.setdefault("metadata", {}).setdefault("name", "claim")
    claim["metadata"].setdefault("namespace", "default")
    return claim


# --------------------------------------------------------------------------------------- fleet state


def _value(raw: Any) -> Fraction | int:
    value = parse_quantity(str((raw or {}).get("value", "0"))).value
    return value.numerator if value.denominator == 1 else value


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key", "")
    if key and key != taint.get("key"):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool(key) and toleration.get("value", "") == taint.get("value", "")


def _untolerated(device: Obj, tolerations: list[Obj]) -> list[Obj]:
    return [
        t
        for t in device.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(x, t) for x in tolerations)
    ]


@dataclass
class _Context:
    """Per-state facts shared by all requests: pool problems, counter usage, device holders."""

    state: FleetState
    pool_problem: dict[tuple[str, str], str]
    counter_left: dict[tuple[str, str, str, str], Fraction]
    used_sets: set[tuple[str, str, str]] = field(default_factory=set)
    splits: dict[tuple[DeviceKey, DeviceKey, int], tuple[list[DeviceInfo], list[DeviceInfo]]] = field(
        default_factory=dict
    )
    summaries: dict[tuple[int, int, DeviceKey, DeviceKey, str], _Summary] = field(default_factory=dict)
    # holders_of's results by the identities of the summaries; the summaries are kept alive with them, so
    # an id is never reused while its entry exists.
    holder_sets: dict[tuple[int, ...], tuple[list[_Summary], _Holders]] = field(default_factory=dict)
    _consumption: dict[DeviceKey, list[tuple[tuple[str, str, str, str], Fraction | int]]] = field(
        default_factory=dict
    )

    def holders_of(self, groups: Iterable[_Group]) -> _Holders:
        """The claims holding the groups' devices: all of them, and oldest first (all, and those reserved
        for no consumer). Claims of the same shape share their summaries: this runs once per shape, not
        once per claim over tens of thousands of holders."""
        sources = [s for g in groups for s in g.sources]
        key = tuple(id(s) for s in sources)
        hit = self.holder_sets.get(key)
        if hit is not None:
            return hit[1]
        every = {k: c for s in sources for k, c in s.holders.items()}
        cached = {id(v) for v in self.summaries.values()}
        if not all(i in cached for i in key):
            # A summary made for this request alone (capacity requests, single devices): nothing to share;
            # only the first HOLDERS_SHOWN of each list are ever shown.
            def free(c: Obj) -> bool:
                return not (c.get("status") or {}).get("reservedFor")

            return _Holders(
                every,
                heapq.nsmallest(HOLDERS_SHOWN, every.values(), key=_age_key),
                heapq.nsmallest(HOLDERS_SHOWN, filter(free, every.values()), key=_age_key),
            )
        ordered = sorted(every.values(), key=_age_key)
        unreserved = [c for c in ordered if not (c.get("status") or {}).get("reservedFor")]
        self.holder_sets[key] = (sources, _Holders(every, ordered, unreserved))
        return self.holder_sets[key][1]

    @classmethod
    def of(cls, state: FleetState) -> _Context:
        cached = getattr(state, "_diagnosis_context", None)
        if isinstance(cached, cls):
            return cached
        problems: dict[tuple[str, str], str] = {}
        counts: dict[tuple[str, str], tuple[int, int]] = {}  # pool -> (generation, slices seen)
        wanted: dict[tuple[str, str], int] = {}
        counters: dict[tuple[str, str, str, str], Fraction] = {}
        for s in state.objects["ResourceSlice"]:
            spec = s.get("spec") or {}
            pool = spec.get("pool") or {}
            key = (spec.get("driver", ""), pool.get("name", ""))
            gen = int(pool.get("generation", 0))
            seen_gen, seen = counts.get(key, (-1, 0))
            if gen > seen_gen:
                counts[key] = (gen, 1)
                wanted[key] = int(pool.get("resourceSliceCount", 1))
            elif gen == seen_gen:
                counts[key] = (gen, seen + 1)
        for key, (_, seen) in counts.items():
            if seen != wanted[key]:
                problems[key] = (
                    f"pool {key[0]}/{key[1]} is incomplete: {seen} of {wanted[key]} slices published"
                )
        names: dict[tuple[str, str], set[str]] = {}
        for info in state.devices():
            pool_key = (info.key[0], info.key[1])
            seen_names = names.setdefault(pool_key, set())
            if info.key[2] in seen_names and pool_key not in problems:
                problems[pool_key] = (
                    f"pool {pool_key[0]}/{pool_key[1]} is invalid: duplicate device {info.key[2]}"
                )
            seen_names.add(info.key[2])
        for s in state.objects["ResourceSlice"]:
            spec = s.get("spec") or {}
            for cs in spec.get("sharedCounters") or []:
                for cname, value in (cs.get("counters") or {}).items():
                    ck = (
                        spec.get("driver", ""),
                        (spec.get("pool") or {}).get("name", ""),
                        cs.get("name", ""),
                        cname,
                    )
                    counters[ck] = parse_quantity(str((value or {}).get("value", "0"))).value
        holders = state.holders()
        used: set[tuple[str, str, str]] = set()
        for info in state.devices():
            if info.key in holders and not info.device.get("allowMultipleAllocations"):
                for use in info.device.get("consumesCounters") or []:
                    used.add((info.key[0], info.key[1], use.get("counterSet", "")))
                    for cname, value in (use.get("counters") or {}).items():
                        ck = (info.key[0], info.key[1], use.get("counterSet", ""), cname)
                        if ck in counters:
                            counters[ck] -= parse_quantity(str((value or {}).get("value", "0"))).value
        ctx = cls(state, problems, counters, used)
        object.__setattr__(state, "_diagnosis_context", ctx)
        return ctx

    def consumption(self, info: DeviceInfo) -> list[tuple[tuple[str, str, str, str], Fraction | int]]:
        cached = self._consumption.get(info.key)
        if cached is None:
            cached = [
                ((info.key[0], info.key[1], use.get("counterSet", ""), cname), _value(value))
                for use in info.device.get("consumesCounters") or []
                for cname, value in (use.get("counters") or {}).items()
            ]
            self._consumption[info.key] = cached
        return cached

    def split_skipped(self, batch: list[DeviceInfo]) -> tuple[list[DeviceInfo], list[DeviceInfo]]:
        """(devices the allocator skips before their selectors: in use or in an unusable pool; the rest)."""
        key = (batch[0].key, batch[-1].key, len(batch))
        found = self.splits.get(key)
        if found is None:
            holders = self.state.holders()
            skipped: list[DeviceInfo] = []
            rest: list[DeviceInfo] = []
            for i in batch:
                held = holders.get(i.key)
                in_use = held and _shares(i, held) is None
                (skipped if in_use or (i.key[0], i.key[1]) in self.pool_problem else rest).append(i)
            found = self.splits[key] = (skipped, rest)
        return found

    def counters_fit(self, info: DeviceInfo) -> bool:
        uses = info.device.get("consumesCounters")
        if not uses:
            return True
        driver, pool = info.key[0], info.key[1]
        if not any((driver, pool, use.get("counterSet", "")) in self.used_sets for use in uses):
            return True  # nobody consumes this device's counter sets
        return all(self.counter_left.get(ck, 0) >= need for ck, need in self.consumption(info))


# ------------------------------------------------------------------------------------ device analysis


@dataclass
class _Group:
    model: str
    profile: str
    total: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    miss: tuple[str, str] | None = None
    holders: dict[str, Obj] = field(default_factory=dict)  # filled while summarizing (a scratch group)
    free_nodes: dict[str, int] = field(default_factory=dict)
    taints: dict[str, int] = field(default_factory=dict)
    pool_problems: set[str] = field(default_factory=set)
    # The summaries whose holders this group has: they are shared by every claim of the same shape, so the
    # union of their holders is computed (and sorted) once per state, see _Context.holders_of.
    sources: list[_Summary] = field(default_factory=list)


@dataclass
class _Analysis:
    ctx: _Context
    req: _Req
    groups: dict[tuple[str, str], _Group] = field(default_factory=dict)
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


def _make_req(item: Obj, classes: dict[str, Obj]) -> _Req:
    spec = item["spec"]
    class_obj = classes.get(spec.get("deviceClassName", "")) or {}
    mode = spec.get("allocationMode") or "ExactCount"
    return _Req(
        name=item["name"],
        parent=item["parent"],
        spec=spec,
        class_name=spec.get("deviceClassName", ""),
        count=int(spec.get("count", 1)) if mode == "ExactCount" else 0,
        all_mode=mode == "All",
        selectors=[compile_selector(e) for e in _selectors(spec)],
        class_selectors=[compile_selector(e) for e in _selectors(class_obj.get("spec") or {})],
        tolerations=list(spec.get("tolerations") or []),
        capacity={
            k: parse_quantity(str(v)).value
            for k, v in ((spec.get("capacity") or {}).get("requests") or {}).items()
        },
        admin=bool(spec.get("adminAccess")),
    )


_CLASS_MISS = "class"


def _selector_outcome(ctx: _Context, req: _Req, info: DeviceInfo) -> tuple[str, int, CelRuntimeError | None]:
    """(outcome, selectors evaluated, error): class selectors first, then the request's (``isSelectable``)."""
    evaluated = 0
    try:
        for s in req.class_selectors:
            evaluated += 1
            if not _match(ctx.state, s, info):
                return _CLASS_MISS, evaluated, None
        for s in req.selectors:
            evaluated += 1
            if not _match(ctx.state, s, info):
                return SELECTOR, evaluated, None
    except CelRuntimeError as exc:
        return ERROR, evaluated, exc
    return FREE, evaluated, None


def _analyze(ctx: _Context, req: _Req, nodes: set[str] | None) -> _Analysis:
    """Walk the fleet once (allocator check order) and group the outcome by model x profile.

    Devices with one signature (same low-cardinality attributes and capacities) share the selector
    outcome when no selector reads a high-cardinality attribute: one representative is evaluated."""
    out = _Analysis(ctx, req)
    state = ctx.state
    holders = state.holders()
    high = state.high_cardinality
    shared = all(not s.opaque and not (s.references & high) for s in (*req.class_selectors, *req.selectors))
    idle: list[list[DeviceInfo]] = []
    for members in state.signature_groups():
        if nodes is not None:
            members = [i for i in members if not i.node or i.node in nodes]
        if not members:
            continue
        batches = [members] if shared else [[i] for i in members]
        for batch in batches:
            rep = batch[0]
            outcome, evaluated, error = _selector_outcome(ctx, req, rep)
            state.saved += evaluated * (len(batch) - 1)
            if error is not None and not req.all_mode and not req.admin:
                # The allocator skips devices in use and pools it cannot use before evaluating selectors.
                skipped, batch = ctx.split_skipped(batch)
                if skipped:
                    _record(ctx, req, out, skipped, FREE, holders, idle)
                    if not batch:
                        continue
                    rep = batch[0]
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
            _record(ctx, req, out, batch, outcome, holders, idle)
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
    ctx: _Context,
    req: _Req,
    out: _Analysis,
    batch: list[DeviceInfo],
    outcome: str,
    holders: dict[DeviceKey, list[Obj]],
    idle: list[list[DeviceInfo]],
) -> None:
    rep = batch[0]
    group = out.groups.setdefault((rep.model, rep.profile), _Group(rep.model, rep.profile))
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
        summary = _summarize(ctx, req, batch, holders)
    else:  # whole signature group: the outcome depends only on the fleet state and the tolerations
        key = (rep.sig, len(batch), batch[0].key, batch[-1].key, repr((req.tolerations, req.admin)))
        cached = ctx.summaries.get(key)
        if cached is None:
            cached = ctx.summaries[key] = _summarize(ctx, req, batch, holders)
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


@dataclass
class _Summary:
    """State outcomes of a batch of devices that passed the selectors."""

    outcomes: dict[str, int] = field(default_factory=dict)
    free_nodes: dict[str, int] = field(default_factory=dict)
    taints: dict[str, int] = field(default_factory=dict)
    holders: dict[str, Obj] = field(default_factory=dict)
    pool_problems: set[str] = field(default_factory=set)
    candidate_nodes: set[str] = field(default_factory=set)
    free: list[DeviceInfo] = field(default_factory=list)


def _summarize(
    ctx: _Context, req: _Req, batch: list[DeviceInfo], holders: dict[DeviceKey, list[Obj]]
) -> _Summary:
    summary = _Summary()
    scratch = _Group("", "")
    for info in batch:
        result = _state_outcome(ctx, req, info, scratch, holders)
        summary.outcomes[result] = summary.outcomes.get(result, 0) + 1
        if result not in (SELECTOR, CAPACITY):
            summary.candidate_nodes.add(info.node)
        if result == FREE:
            summary.free.append(info)
            summary.free_nodes[info.node] = summary.free_nodes.get(info.node, 0) + 1
    summary.taints, summary.holders, summary.pool_problems = (
        scratch.taints,
        scratch.holders,
        scratch.pool_problems,
    )
    return summary


def _shares(info: DeviceInfo, held: list[Obj]) -> list[Obj] | None:
    """The results of ``held`` on a shareable device, or None when one of them holds it whole (a result
    without shareID is dedicated, whatever the device allows: the scheduler's allocateddevices.go)."""
    if not info.device.get("allowMultipleAllocations"):
        return None
    out = []
    for claim in held:
        for r in claim_results(claim):
            if (r.get("driver"), r.get("pool"), r.get("device")) == info.key and not r.get("adminAccess"):
                if not r.get("shareID"):
                    return None
                out.append(r)
    return out


def _capacity_left(req: _Req, info: DeviceInfo, shares: list[Obj]) -> str:
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
    ctx: _Context, req: _Req, info: DeviceInfo, group: _Group, holders: dict[DeviceKey, list[Obj]]
) -> str:
    if req.capacity and _capacity_left(req, info, []) == CAPACITY:
        return CAPACITY
    problem = ctx.pool_problem.get((info.key[0], info.key[1]))
    if problem:
        group.pool_problems.add(problem)
        return POOL
    held = None if req.admin else holders.get(info.key)
    if held:
        shares = _shares(info, held)
        if shares is None or _capacity_left(req, info, shares) != FREE:
            for claim in held:
                group.holders[str(id(claim))] = claim
            return ALLOCATED
    untolerated = _untolerated(info.device, req.tolerations)
    if untolerated:
        for t in untolerated:
            label = f"{t.get('key', '')}={t.get('value', '')}:{t.get('effect', '')}"
            group.taints[label] = group.taints.get(label, 0) + 1
        return TAINT
    if not ctx.counters_fit(info):
        return COUNTERS
    return FREE


# ------------------------------------------------------------------------------------------ placement


def _pod_nodes(state: FleetState, pod: Obj | None) -> set[str] | None:
    selector = ((pod or {}).get("spec") or {}).get("nodeSelector") or {}
    if not selector:
        return None
    out = set()
    for node in state.objects["Node"]:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if all(labels.get(k) == v for k, v in selector.items()):
            out.add(str((node.get("metadata") or {}).get("name", "")))
    return out


def _place(
    state: FleetState, claims: list[Obj], analyses: list[list[_Analysis]], nodes: set[str] | None
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


# ------------------------------------------------------------------------------------------- entry points


def _device_desc(info: DeviceInfo) -> str:
    return f"{info.model} {info.profile}".strip() if info.profile else info.model


def _group_label(g: _Group) -> str:
    return f"{g.model} {g.profile}".strip()


HOLDERS_SHOWN = 20


def _age_key(claim: Obj) -> tuple[str, str]:
    return (claim.get("metadata") or {}).get("creationTimestamp") or "", klog(claim)


@dataclass(frozen=True)
class _Holders:
    every: dict[str, Obj]  # by id
    oldest: list[Obj]  # every holder, oldest first
    unreserved: list[Obj]  # those reserved for no consumer, oldest first


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


def _group_reason(g: _Group, req: _Req) -> str:
    if g.outcomes.get(SELECTOR) and g.miss:
        return f"{g.miss[1]} on {g.outcomes[SELECTOR]} {_group_label(g)}"
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


def _request_detail(state: FleetState, a: _Analysis) -> Obj:
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
        "count": "All" if a.req.all_mode else a.req.count,
        "selectors": [s.expression for s in a.req.selectors],
        "matching": a.matching,
        "free": a.count(FREE),
        "groups": groups,
        "holders": [_holder_entry(state, c) for c in holders],
        "holders_total": len(every),
        "idle_bigger_mig": dict(a.fragment_idle),
    }


def prepare(state: FleetState) -> FleetState:
    """Build every per-fleet index once (device groups, holders, counters, the allocator's slice index and
    in-use baseline, device states without tolerations), so that each diagnosis only pays for its own
    requests. Optional: ``diagnose`` builds what it needs lazily. Returns ``state``."""
    ctx = _Context.of(state)
    published_names(state)
    nodes = state.node_names()
    if nodes:
        allocate([], nodes[0], state.snapshot)
    plain = _Req("", "", {}, "", 1, False, [], [], [], {})
    holders = state.holders()
    for members in state.signature_groups():
        if len(members) > 1:
            key = (
                members[0].sig,
                len(members),
                members[0].key,
                members[-1].key,
                repr((plain.tolerations, plain.admin)),
            )
            if key not in ctx.summaries:
                ctx.summaries[key] = _summarize(ctx, plain, members, holders)
    return state


def diagnose(state: FleetState, obj: Obj, pods_in: Callable[[str], bool] | None = None) -> Diagnosis:
    """Diagnose a ResourceClaim, a ResourceClaimTemplate (as the claim it would stamp) or a Pod.

    The pods using a claim (their node selector, the scheduler's message) are looked up only when
    ``pods_in(namespace)`` allows the claim's namespace (every namespace when None); otherwise the claim is
    diagnosed as no pod used it, like a template. What-if passes the user's visibility here."""
    if obj.get("kind") == "Pod":
        return _diagnose_pod(state, obj)
    unsupported = unsupported_api_version(obj)
    if unsupported:
        return Diagnosis(
            "unsupported",
            f"{obj.get('kind', 'Object')} {klog(obj)}: {unsupported}.",
            claim=klog(obj),
            suggestions=["Write the claim for resource.k8s.io/v1 (or v1beta2/v1beta1)."],
        )
    obj = claim_as_v1(obj)
    claim = _claim_from(obj)
    pods: list[Obj] = []
    if obj.get("kind") == "ResourceClaim":
        namespace = str((claim.get("metadata") or {}).get("namespace") or "")
        if pods_in is None or pods_in(namespace):
            pods = state.pods_of_claim(claim)
    return _diagnose_claim(state, claim, pods[0] if pods else None, lint_object(obj, state))


def diagnose_name(state: FleetState, namespace: str, name: str) -> Diagnosis:
    """Diagnose the claim ``namespace/name``, else the pod of that name. Raises LookupError."""
    claim = state.find("ResourceClaim", namespace, name)
    if claim is not None:
        return diagnose(state, claim)
    pod = state.find("Pod", namespace, name)
    if pod is not None:
        return diagnose(state, pod)
    raise LookupError(f"no ResourceClaim or Pod {namespace}/{name} in the fleet")


def _diagnose_pod(state: FleetState, pod: Obj) -> Diagnosis:
    meta = pod.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    claims: list[Obj] = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        claim_name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
        if not claim_name:
            events = [
                e
                for e in state.events_for("Pod", ns, name)
                if e.get("reason") in ("FailedResourceClaimCreation", "FailedCreate")
            ]
            event = events[-1].get("message", "") if events else ""
            template = ref.get("resourceClaimTemplateName", "")
            missing = template and state.find("ResourceClaimTemplate", ns, template) is None
            summary = (
                f'Claim "{ref.get("name")}" of pod {ns}/{name} was never created from template {template}'
            )
            summary += f": {event}" if event else (": the template does not exist" if missing else "")
            suggestions = (
                [f"Create ResourceClaimTemplate {ns}/{template}, or fix the pod's resourceClaimTemplateName."]
                if missing
                else ["Check kube-controller-manager (resource-claim controller) events and logs."]
            )
            return Diagnosis(
                "not-created",
                summary + ".",
                suggestions=suggestions,
                pod=f"{ns}/{name}",
                scheduler_message=f'pod "{ns}/{name}": ResourceClaim not created yet',
            )
        claim = state.find("ResourceClaim", ns, claim_name)
        if claim is None:
            return Diagnosis(
                "not-created",
                f"ResourceClaim {ns}/{claim_name} used by pod {ns}/{name} does not exist.",
                suggestions=[f"Create ResourceClaim {ns}/{claim_name} or fix the pod spec."],
                pod=f"{ns}/{name}",
                scheduler_message=f'could not find ResourceClaim "{ns}/{claim_name}"',
            )
        claims.append(claim)
    pending = [c for c in claims if not claim_results(c)]
    extended = extended_resource_claim(state, pod)
    if extended is not None:
        pending.append(extended)  # the scheduler allocates it together with the pod's own claims
    if not pending:
        return Diagnosis("fits", f"All claims of pod {ns}/{name} are allocated.", pod=f"{ns}/{name}")
    return _diagnose_claim(state, pending[0], pod, lint_object(pending[0], state), others=pending[1:])


EXTENDED_CLAIM_NAME = "<extended-resources>"  # the scheduler's in-memory name (specialClaimInMemName)
IMPLICIT_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"


def _class_for_resources(state: FleetState) -> dict[str, str]:
    """Extended resource name -> DeviceClass (``extendedResourceName``; on a clash the newest class, then
    the lower name, as the scheduler's extended resource cache), plus the implicit
    ``deviceclass.resource.kubernetes.io/<class>`` of every class."""
    out: dict[str, str] = {}
    chosen: dict[str, tuple[str, str]] = {}
    for device_class in state.objects["DeviceClass"]:
        meta = device_class.get("metadata") or {}
        name = str(meta.get("name", ""))
        out[IMPLICIT_CLASS_PREFIX + name] = name
        resource = (device_class.get("spec") or {}).get("extendedResourceName")
        if not resource:
            continue
        created = str(meta.get("creationTimestamp") or "")
        best = chosen.get(resource)
        if best is None or created > best[0] or (created == best[0] and name < best[1]):
            chosen[resource] = (created, name)
    out.update({resource: name for resource, (_, name) in chosen.items()})
    return out


def _container_count(container: Obj, resource: str) -> int:
    resources = container.get("resources") or {}
    # The API server defaults an extended resource's request to its limit; a pasted pod may have only that.
    raw = (resources.get("requests") or {}).get(resource, (resources.get("limits") or {}).get(resource))
    if raw is None:
        return 0
    try:
        value = parse_quantity(str(raw)).value
    except QuantityError:
        return 0
    return int(value) if value.denominator == 1 else 0


def _container_request(
    index: int, container: Obj, resource: str, class_name: str, reusable: list[Obj | None]
) -> Obj | None:
    """``createResourceRequestAndMappings``: the request a container adds for ``resource`` (None when the
    requests it may reuse already cover it). Named container-<index>-request-<index of the resource among
    the container's sorted requests>."""
    wanted = _container_count(container, resource)
    if not wanted:
        return None
    covered = 0
    for other in reusable:
        if other is not None:
            covered += int(other["exactly"]["count"])
            if covered >= wanted:
                return None
    resources = container.get("resources") or {}
    names = sorted({*(resources.get("requests") or {}), *(resources.get("limits") or {})})
    return {
        "name": f"container-{index}-request-{names.index(resource)}",
        "exactly": {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": wanted - covered},
    }


def extended_resource_claim(state: FleetState, pod: Obj) -> Obj | None:
    """The claim the scheduler builds for a pod's DRA extended resources (``nvidia.com/gpu: 1`` backed by a
    DeviceClass with that ``extendedResourceName``), or None when there is none or it is already allocated.
    A port of ``createRequestsAndMappings`` (extendeddynamicresources.go). Nodes that offer the resource
    through a device plugin (node allocatable) are not told apart: the diagnosis assumes DRA everywhere."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status_name = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
        "resourceClaimName"
    )
    if status_name:
        existing = state.find("ResourceClaim", str(meta.get("namespace", "")), str(status_name))
        if existing is not None and claim_results(existing):
            return None
    classes = _class_for_resources(state)
    init = list(spec.get("initContainers") or [])
    containers = [*init, *(spec.get("containers") or [])]
    wanted = sorted(
        {
            resource
            for c in containers
            for part in ("requests", "limits")
            for resource in ((c.get("resources") or {}).get(part) or {})
            if resource in classes
        }
    )
    requests: list[Obj] = []
    for resource in wanted:
        long_lived = [
            i for i, c in enumerate(containers) if i >= len(init) or c.get("restartPolicy") == "Always"
        ]
        short_lived = [i for i in range(len(init)) if i not in long_lived]
        per_container: list[Obj | None] = [None] * len(containers)
        for i in long_lived:
            per_container[i] = _container_request(i, containers[i], resource, classes[resource], [])
        biggest: Obj | None = None
        for i in short_lived:
            request = _container_request(i, containers[i], resource, classes[resource], per_container[i:])
            if request is not None and (
                biggest is None or biggest["exactly"]["count"] < request["exactly"]["count"]
            ):
                biggest = request
        requests += [r for r in ([biggest] if biggest else []) + per_container if r is not None]
    if not requests:
        return None
    requests.sort(key=lambda r: str(r["name"]))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": meta.get("namespace", ""), "name": EXTENDED_CLAIM_NAME},
        "spec": {"devices": {"requests": requests}},
    }


def _scheduled_message(pod: Obj | None) -> str:
    for cond in ((pod or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message", ""))
    return ""


def _diagnose_claim(
    state: FleetState, claim: Obj, pod: Obj | None, findings: list[Finding], others: list[Obj] | None = None
) -> Diagnosis:
    name = klog(claim)
    base = Diagnosis(
        "",
        "",
        lint=[f.as_dict() for f in findings],
        claim=name,
        pod=klog(pod) if pod else "",
    )
    if claim_results(claim):
        base.category = "fits"
        base.summary = f"{name} is already allocated ({len(claim_results(claim))} devices)."
        return base
    # 1. compile errors (the apiserver would reject the claim; a stored one aborts scheduling)
    for f in findings:
        if f.code == "cel-compile":
            base.category = "cel-error"
            base.summary = f"Selector of request {f.where} does not compile: {f.message.splitlines()[0]}"
            base.requests = [{"name": f.where, "expression": f.expression, "error": f.message}]
            base.suggestions = [f.suggestion] if f.suggestion else []
            return base
    # 2. classes
    classes = {str((c.get("metadata") or {}).get("name", "")): c for c in state.objects["DeviceClass"]}
    requests = _requests_of(claim)
    for alternatives in requests:
        for item in alternatives:
            cname = item["spec"].get("deviceClassName", "")
            if cname not in classes:
                base.category = "class-missing"
                base.summary = (
                    f"Request {item['name']} asks for device class {cname!r}, which does not exist."
                )
                base.scheduler_message = f"request {item['name']}: device class {cname} does not exist"
                known = ", ".join(sorted(classes)) or "none"
                base.suggestions = [
                    f"Use an existing class ({known}) or install the driver's DeviceClass {cname}."
                ]
                return base
    # 3. too many
    minimum = sum(
        min(
            int(i["spec"].get("count", 1))
            if (i["spec"].get("allocationMode") or "ExactCount") == "ExactCount"
            else 1
            for i in alts
        )
        for alts in requests
    )
    if minimum > MAX_RESULTS:
        base.category = "too-many"
        base.summary = f"{name} asks for at least {minimum} devices; a claim holds at most {MAX_RESULTS}."
        base.suggestions = [f"Split it into several claims of at most {MAX_RESULTS} devices each."]
        return base
    if not requests:  # nothing to allocate: no fleet, however empty, can keep it pending
        base.category = "fits"
        base.summary = f"{name} requests no devices: there is nothing to allocate."
        return base
    # 4. class selectors: stored classes are not re-validated, the allocator aborts on them (isSelectable)
    for alternatives in requests:
        for item in alternatives:
            cname = item["spec"].get("deviceClassName", "")
            for i, expression in enumerate(_selectors(classes[cname].get("spec") or {})):
                try:
                    compile_selector(expression)
                except CelCompileError as exc:
                    base.category = "cel-error"
                    base.summary = f"Selector #{i} of device class {cname} does not compile: {exc.message}"
                    base.scheduler_message = (
                        f'running "DynamicResources" filter plugin: class {cname}: selector #{i}: '
                        f"CEL compile error: {exc.message}"
                    )
                    base.requests = [{"name": item["name"], "expression": expression, "error": exc.message}]
                    base.suggestions = [f"Fix DeviceClass {cname}: every claim using it fails to schedule."]
                    return base
    # 5. per-device analysis + allocator replay
    ctx = _Context.of(state)
    nodes = _pod_nodes(state, pod)
    analyses = [[_analyze(ctx, _make_req(item, classes), nodes) for item in alts] for alts in requests]
    base.requests = [_request_detail(state, a) for alts in analyses for a in alts]
    node, result, _ = _place(state, [claim, *(others or [])], analyses, nodes)
    if result is not None and result.ok and node is not None:
        return _fits(state, base, claim, pod, node, result)
    if result is not None and result.kind == "error":
        return _error(base, claim, result.message, analyses)
    base.scheduler_message = "cannot allocate all claims"
    invalid = _invalid_pools(state, ctx, nodes)
    if invalid:
        # allocator: "invalid resource pools were encountered" when nothing fits on a node with one
        base.scheduler_message = "invalid resource pools were encountered"
        base.category = "pool"
        base.summary = (
            "The scheduler rejects the node(s) because of invalid resource pools: "
            + "; ".join(invalid[:3])
            + "."
        )
        base.suggestions = ["Fix the driver's ResourceSlices (each device name once per pool)."]
        return base
    return _unschedulable(
        base,
        analyses,
        list(((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []),
        len(others or []),
    )


def _invalid_pools(state: FleetState, ctx: _Context, nodes: set[str] | None) -> list[str]:
    """Problems of invalid pools with devices on the nodes the pod may use (all nodes when None)."""
    found = set()
    for info in state.devices():
        problem = ctx.pool_problem.get((info.key[0], info.key[1]), "")
        if " is invalid: " in problem and (nodes is None or not info.node or info.node in nodes):
            found.add(problem)
    return sorted(found)


def _fits(
    state: FleetState, base: Diagnosis, claim: Obj, pod: Obj | None, node: str, result: AllocationResult
) -> Diagnosis:
    infos = state.device_index()
    devices = []
    for r in ((result.allocations.get(klog(claim)) or {}).get("devices") or {}).get("results") or []:
        info = infos.get((r["driver"], r["pool"], r["device"]))
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
    message = _scheduled_message(pod)
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


def _error(base: Diagnosis, claim: Obj, message: str, analyses: list[list[_Analysis]]) -> Diagnosis:
    base.scheduler_message = f'running "DynamicResources" filter plugin: {message}'
    if "CEL runtime error" in message:
        base.category = "cel-error"
        key = re.search(r"no such key: (\S+?)(?:\.|$| )", message)
        attribute = key.group(1) if key else ""
        failing = next((a for alts in analyses for a in alts if a.error), None)
        expression = failing.error_selector if failing else ""
        base.requests.insert(
            0,
            {
                "name": failing.req.name if failing else "",
                "expression": expression,
                "attribute": attribute,
                "error": message,
            },
        )
        where = "class" if message.startswith("class ") else "claim"
        base.summary = (
            f"Scheduling aborts (SchedulerError): the {where} selector `{expression}` fails at runtime on "
            f"{failing.error_device if failing else 'a device'}: "
            + (f"no such key: {attribute}" if attribute else message.split("CEL runtime error: ", 1)[-1])
            + "."
        )
        fix = (
            f"Guard the attribute: has(device.attributes[...].{attribute}) && …, "
            f"or use .?{attribute}.orValue(…)"
        )
        base.suggestions = [
            fix if attribute else "Fix the selector so it evaluates to a bool on every device."
        ]
        return base
    if "currently being updated" in message or "currently invalid" in message:
        base.category = "pool"
        base.summary = f"Scheduling aborts: {message}."
        base.suggestions = ["Wait for the driver to finish publishing the pool, or fix its ResourceSlices."]
        return base
    if "exceeds the claim limit" in message:
        base.category = "too-many"
        base.summary = f"{message}."
        base.suggestions = [f"Split the claim: at most {MAX_RESULTS} devices per claim."]
        return base
    if "does not exist" in message:
        base.category = "class-missing"
    elif "constraint" in message:
        base.category = "constraint"
    else:
        base.category = "cel-error"
    base.summary = f"Scheduling aborts (SchedulerError): {message}."
    return base


def _fmt_groups(groups: Iterable[_Group]) -> str:
    return ", ".join(f"{g.total} {_group_label(g)}" for g in groups)


def _unschedulable(
    base: Diagnosis, analyses: list[list[_Analysis]], constraints: list[Obj], others: int = 0
) -> Diagnosis:
    """``others``: how many more claims of the pod must fit on the same node."""
    # The first spec request none of whose alternatives has enough free devices explains the claim.
    blocking = next(
        (alts for alts in analyses if all(a.count(FREE) < a.needed for a in alts)),
        None,
    )
    if blocking is None:
        a = analyses[0][0]
        whole = next(
            (x for alts in analyses for x in alts if x.req.all_mode and x.matching > x.count(FREE)), None
        )
        if whole is not None:
            return _all_mode_blocked(base, whole)
        if others:
            base.category = "capacity"
            base.summary = (
                f"{base.claim} could get its devices ({a.count(FREE)} free match request {a.req.name}), but "
                f"not together with the pod's {others} other claim(s) on one node: they compete for the "
                "same devices or GPUs."
            )
            base.suggestions = ["Free devices on one node, or ask for fewer devices across the pod's claims."]
            return base
        if constraints:
            base.category = "constraint"
            base.summary = _constraint_summary(base, analyses, constraints)
            base.suggestions = [
                "Relax matchAttribute/distinctAttribute, or lower count so one attribute value can hold it."
            ]
        else:
            best = max((n for node, n in a.free_by_node.items() if node), default=0)
            base.category = "capacity"
            if a.free_by_node.get(""):
                base.summary = (
                    f"Request {a.req.name} needs {a.needed}: {a.free_by_node['']} matching devices are free "
                    "in node-less slices (allNodes, nodeSelector), but no node the pod can use reaches them."
                )
                base.suggestions = ["Check the slices' nodeSelector against the nodes' labels."]
            else:
                base.summary = (
                    f"Request {a.req.name} needs {a.needed} devices on one node: {a.count(FREE)} free "
                    f"devices match, but at most {best} on any single node."
                )
                base.suggestions = [
                    "Lower the count, or free devices on one node (drain a node's smaller jobs)."
                ]
        return base
    # Prefer the first alternative that has matching devices (firstAvailable order).
    a = next((x for x in blocking if x.matching > 0), blocking[0])
    matching_groups = [
        g
        for g in a.groups.values()
        if g.total - g.outcomes.get(SELECTOR, 0) - g.outcomes.get(CAPACITY, 0) > 0
    ]
    label = ", ".join(sorted({_group_label(g) for g in matching_groups}))
    if a.matching == 0:
        base.category = "no-match"
        misses = sorted(
            (g for g in a.groups.values() if g.miss), key=lambda g: (-g.total, g.model, g.profile)
        )[:3]
        near = "; ".join(f"{g.miss[1]} on {g.total} {_group_label(g)}" for g in misses if g.miss)
        short = a.count(CAPACITY)
        if short and not near:
            near = (
                f"{short} devices pass the selectors but cannot serve capacity.requests (capacity missing, "
                "too small, or outside the device's requestPolicy)"
            )
        base.summary = f"No device in the fleet matches request {a.req.name}" + (
            f": {near}." if near else "."
        )
        if misses and misses[0].miss:
            base.suggestions = [
                f"Relax the clause `{misses[0].miss[0]}` (nearest miss: {misses[0].miss[1]})."
            ]
        else:
            base.suggestions = [
                "Check the request's device class and selectors against the published devices."
            ]
        return base
    pool_blocked = a.count(POOL)
    if pool_blocked and a.count(FREE) + a.count(ALLOCATED) + a.count(TAINT) + a.count(COUNTERS) < a.needed:
        problems = sorted({p for g in a.groups.values() for p in g.pool_problems})
        base.category = "pool"
        base.summary = (
            f"{pool_blocked} matching {label} devices are in incomplete or invalid pools the scheduler "
            "skips: " + "; ".join(problems[:3]) + "."
        )
        base.suggestions = ["Check the driver: a pool is mid-update or publishes inconsistent slices."]
        return base
    tainted = a.count(TAINT)
    if tainted and a.count(FREE) + tainted >= a.needed:
        taints: dict[str, int] = {}
        for g in a.groups.values():
            for t, n in g.taints.items():
                taints[t] = taints.get(t, 0) + n
        which = ", ".join(f"{t} ({n})" for t, n in sorted(taints.items()))
        base.category = "taint"
        base.summary = (
            f"{tainted} matching {label} devices are free but tainted ({which}); request {a.req.name} "
            f"tolerates none of them ({a.count(FREE)} untainted free, {a.needed} needed)."
        )
        base.suggestions = [
            "Add a toleration for the taint to the request if the workload can run on those devices, "
            "or ask the fleet owner why they are tainted."
        ]
        return base
    mig_request = bool(matching_groups) and all(g.profile for g in matching_groups)
    counters_blocked = a.count(COUNTERS)
    if mig_request and (a.fragment_idle or counters_blocked):
        idle = ", ".join(f"{n} x {p}" for p, n in sorted(a.fragment_idle.items()))
        base.category = "fragmentation"
        base.summary = (
            f"Request {a.req.name} wants {a.needed} x {label}: none free ({a.count(ALLOCATED)} allocated"
            + (f", {counters_blocked} blocked by their GPU's shared counters" if counters_blocked else "")
            + ")"
            + (f", while bigger MIG slices sit idle: {idle}." if idle else ".")
        )
        base.suggestions = [
            "Add a firstAvailable fallback to a bigger profile (e.g. 3g) so idle slices can serve it, "
            "or re-partition a GPU with idle bigger slices into the requested profile."
        ]
        return base
    held = a.ctx.holders_of(a.groups.values())
    every, holders = held.every, held.oldest[:3]
    named = ", ".join(klog(c) for c in holders) + (f" and {len(every) - 3} more" if len(every) > 3 else "")
    base.category = "capacity"
    blocked = (
        f", {counters_blocked} blocked by their GPU's shared counters (another partition of it is in use)"
        if counters_blocked
        else ""
    )
    base.summary = (
        f"Request {a.req.name} needs {a.needed}: {a.matching} devices match "
        f"({_fmt_groups(matching_groups)}), "
        f"{a.count(FREE)} free{blocked}" + (f"; held by {named} (oldest first)." if named else ".")
    )
    unreserved = held.unreserved[:HOLDERS_SHOWN]
    base.suggestions = (
        ["Wait for a holder to finish, or free devices held by the oldest claims."]
        if every
        else ["Free a partition of the same GPU, or ask for a device that does not share its counters."]
        if counters_blocked
        else []
    )
    if unreserved:
        base.suggestions.insert(
            0,
            f"{len(unreserved)} holder(s) are allocated but reserved by no pod (leaked?): "
            + ", ".join(klog(c) for c in unreserved[:3])
            + "; deleting them frees their devices.",
        )
    return base


def _all_mode_blocked(base: Diagnosis, a: _Analysis) -> Diagnosis:
    """An ``All`` request gets every matching device of a node or nothing: name what keeps the others."""
    held = a.ctx.holders_of(a.groups.values())
    every, holders = held.every, held.oldest[:3]
    named = ", ".join(klog(c) for c in holders) + (f" and {len(every) - 3} more" if len(every) > 3 else "")
    reasons = [
        f"{n} {what}"
        for n, what in (
            (a.count(ALLOCATED), "allocated"),
            (a.count(TAINT), "tainted"),
            (a.count(COUNTERS), "blocked by shared counters"),
        )
        if n
    ]
    base.category = "taint" if not every and a.count(TAINT) else "capacity"
    base.summary = (
        f"Request {a.req.name} asks for all matching devices of a node ({a.matching} match), and gets none "
        f"unless all are usable: {', '.join(reasons)}"
        + (f"; held by {named} (oldest first)." if named else ".")
    )
    base.suggestions = (
        ["Wait for the holders to finish, or use allocationMode ExactCount with a count."]
        if every
        else ["Use allocationMode ExactCount with a count, or tolerate the devices' taints."]
    )
    return base


def _attribute(info: DeviceInfo, name: str) -> str | None:
    attrs = info.device.get("attributes") or {}
    domain, _, ident = name.rpartition("/")
    raw = attrs.get(name) or (attrs.get(ident) if domain == info.key[0] else None)
    return str(next(iter(raw.values()), "")) if isinstance(raw, dict) else None


def constraint_values(analyses: list[list[_Analysis]], constraints: list[Obj]) -> list[Obj]:
    """Per constraint: free matching devices per attribute value (per node), devices lacking it."""
    out = []
    for c in constraints:
        attr = c.get("matchAttribute") or c.get("distinctAttribute") or ""
        names = set(c.get("requests") or [])
        per_value: dict[str, int] = {}
        lacking = 0
        seen: set[DeviceKey] = set()
        for alts in analyses:
            for a in alts:
                if names and a.req.parent not in names and a.req.name not in names:
                    continue
                for info in a.free:
                    if info.key in seen:
                        continue
                    seen.add(info.key)
                    value = _attribute(info, attr)
                    if value is None:
                        lacking += 1
                    else:
                        label = f"{info.node}: {value}"
                        per_value[label] = per_value.get(label, 0) + 1
        out.append(
            {
                "attribute": attr,
                "kind": "match" if c.get("matchAttribute") else "distinct",
                "free_per_value": per_value,
                "free_without_attribute": lacking,
            }
        )
    return out


def _constraint_summary(base: Diagnosis, analyses: list[list[_Analysis]], constraints: list[Obj]) -> str:
    a = analyses[0][0]
    details = constraint_values(analyses, constraints)
    base.requests.append({"name": "constraints", "constraints": details})
    parts = []
    for d in details:
        best = max(d["free_per_value"].values(), default=0)
        parts.append(
            f"{d['kind']}Attribute {d['attribute']}: {len(d['free_per_value'])} value(s), "
            f"at most {best} free "
            f"devices share one"
            + (f", {d['free_without_attribute']} free devices lack it" if d["free_without_attribute"] else "")
        )
    return (
        f"Enough free devices match each request ({a.count(FREE)} free for {a.req.name}), but no set of them "
        "satisfies the claim's constraints on one node: " + "; ".join(parts) + "."
    )
