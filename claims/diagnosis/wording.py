"""Causes in words: why a claim does not fit (capacity, no match, fragmentation, constraint, taint, pool,
CEL error, too many devices), as a one-line summary for the on-call engineer, with suggestions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from claims.allocator import (
    CEL_RUNTIME,
    CLAIM_LIMIT,
    CLASS_MISSING,
    CONSTRAINT,
    FILTER_ERROR,
    MAX_RESULTS,
    POOL_UNUSABLE,
    UNSUPPORTED,
    AllocationResult,
)
from claims.diagnosis.analysis import Analysis
from claims.diagnosis.details import group_label
from claims.diagnosis.groups import HOLDERS_SHOWN, Group
from claims.diagnosis.result import ALLOCATED, CAPACITY, COUNTERS, FREE, POOL, SELECTOR, TAINT, Diagnosis, Obj
from claims.fleetstate import DeviceInfo, DeviceKey, klog
from fleet.taint_rules import rules_named

# What to do about an abort of reason UNSUPPORTED.
UNSUPPORTED_FIX = (
    "Turn on the scheduler's feature gate for what the claim uses (DRAAdminAccess, DRAPrioritizedList, "
    "DRAConsumableCapacity), or write the claim with only what this cluster's resource.k8s.io version "
    "knows."
)


def error_diagnosis(
    base: Diagnosis, claim: Obj, result: AllocationResult, analyses: list[list[Analysis]]
) -> Diagnosis:
    """The diagnosis of an attempt that aborts, by the allocator's reason (its message also holds names
    the user chose, which may read like another reason)."""
    message, reason = result.message, result.reason
    base.scheduler_message = FILTER_ERROR + message
    if reason == CEL_RUNTIME:
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
    if reason == POOL_UNUSABLE:
        base.category = "pool"
        base.summary = f"Scheduling aborts: {message}."
        base.suggestions = ["Wait for the driver to finish publishing the pool, or fix its ResourceSlices."]
        return base
    if reason == CLAIM_LIMIT:
        base.category = "too-many"
        base.summary = f"{message}."
        base.suggestions = [f"Split the claim: at most {MAX_RESULTS} devices per claim."]
        return base
    if reason == UNSUPPORTED:
        base.category = "unsupported"
        base.summary = f"Scheduling aborts (SchedulerError): {message}."
        base.suggestions = [UNSUPPORTED_FIX]
        return base
    # A selector that does not compile has no reason of its own.
    categories = {CLASS_MISSING: "class-missing", CONSTRAINT: "constraint", "": "cel-error"}
    if reason not in categories:
        raise ValueError(f"an allocator abort of unknown reason {reason!r}: {message}")
    base.category = categories[reason]
    base.summary = f"Scheduling aborts (SchedulerError): {message}."
    return base


def _fmt_groups(groups: Iterable[Group]) -> str:
    return ", ".join(f"{g.total} {group_label(g)}" for g in groups)


def unschedulable(
    base: Diagnosis, analyses: list[list[Analysis]], constraints: list[Obj], others: int = 0
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
    label = ", ".join(sorted({group_label(g) for g in matching_groups}))
    if a.matching == 0:
        base.category = "no-match"
        misses = sorted(
            (g for g in a.groups.values() if g.miss), key=lambda g: (-g.total, g.model, g.profile)
        )[:3]
        near = "; ".join(f"{g.miss[1]} on {g.total} {group_label(g)}" for g in misses if g.miss)
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
        base.suggestions += [
            f"The taint comes from DeviceTaintRule {rule} (kubectl get devicetaintrule {rule} -o yaml); "
            "deleting the rule untaints its devices."
            for rule in rules_named(taints)
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


def _all_mode_blocked(base: Diagnosis, a: Analysis) -> Diagnosis:
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


def constraint_values(analyses: list[list[Analysis]], constraints: list[Obj]) -> list[Obj]:
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


def _constraint_summary(base: Diagnosis, analyses: list[list[Analysis]], constraints: list[Obj]) -> str:
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
