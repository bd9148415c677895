"""What of the fleet a claim's diagnosis can read: the footprint the incremental recompute
(``claims.livestate``) compares against a fleet change, so that only the claims a change can reach are
diagnosed again.

A diagnosis counts, per request, the devices of its class (those passing the class selectors, or whose
class selectors fail with an error) grouped by model x MIG profile: totals, holders, taints, free devices,
the allocator replay on their nodes. Devices of one pool share counters and the pool's validity, so a
change anywhere in a pool reaches every group the pool publishes. Requests with a MIG group also count idle
bigger MIG devices of any class (``analysis.fragment_idle``), so those depend on every MIG group.
"""

from __future__ import annotations

from dataclasses import dataclass

from claims.cel import CelCompileError
from claims.diagnosis.analysis import _CLASS_MISS, _selector_outcome
from claims.diagnosis.groups import Context
from claims.diagnosis.requests import make_req, requests_of
from claims.diagnosis.result import Obj
from claims.fleetstate import FleetState

GroupKey = tuple[str, str]  # (model, MIG profile)


def class_names(claim: Obj) -> frozenset[str]:
    """The device classes a claim's requests (every alternative) name."""
    return frozenset(
        str(item["spec"].get("deviceClassName", "")) for alts in requests_of(claim) for item in alts
    )


def all_groups(state: FleetState) -> frozenset[GroupKey]:
    """The groups of every device: the union of the pools' (a walk of pools, not of ~100,000 devices)."""
    return frozenset().union(*state.pool_groups().values())


def class_groups(state: FleetState) -> dict[str, frozenset[GroupKey]]:
    """Per device class: the groups of the devices a request of that class counts (see the module doc),
    MIG groups widened to every MIG group. A class whose selectors do not compile diagnoses the same
    whatever the devices (a CEL error), but is given every group: that is never wrong, only slower.
    Cached on the state (a state is not changed once built)."""
    cached: dict[str, frozenset[GroupKey]] | None = state.__dict__.get("_class_groups")
    if cached is not None:
        return cached
    every = all_groups(state)
    mig = frozenset(k for k in every if k[1])
    ctx = Context.of(state)
    high = state.high_cardinality
    out: dict[str, frozenset[GroupKey]] = {}
    classes = {str((c.get("metadata") or {}).get("name", "")): c for c in state.objects["DeviceClass"]}
    for name in classes:
        try:
            req = make_req({"name": "", "parent": "", "spec": {"deviceClassName": name}}, classes)
        except (CelCompileError, ValueError):
            out[name] = every
            continue
        shared = all(not s.opaque and not (s.references & high) for s in req.class_selectors)
        found: set[GroupKey] = set()
        for members in state.signature_groups():
            batches = [members] if shared else [[i] for i in members]
            for batch in batches:
                outcome, _, _ = _selector_outcome(ctx, req, batch[0])
                if outcome != _CLASS_MISS:
                    found.add((batch[0].model, batch[0].profile))
        out[name] = frozenset(found | mig) if any(k[1] for k in found) else frozenset(found)
    state.__dict__["_class_groups"] = out
    return out


def fleet_wide(state: FleetState) -> tuple[object, ...]:
    """What every diagnosis reads whatever its classes: pool problems (``invalid_pools``), the attribute
    names published anywhere (the lint), which attributes are high-cardinality (selector sharing), the
    nodes. When one of them changes, every pending claim is diagnosed again."""
    from claims.lint import published_names

    ctx = Context.of(state)
    return (
        sorted(ctx.pool_problem.items()),
        published_names(state),
        state.high_cardinality,
        state.node_names(),
    )


@dataclass(frozen=True)
class Footprint:
    """What the incremental recompute compares of the fleet before a change (``claims.livestate.affected``),
    kept in place of the state itself: a state's indexes and per-fleet context would otherwise live until
    the next update and overlap the next state's (at XL ~200 MB more at the peak of every update)."""

    wide: tuple[object, ...]  # fleet_wide
    pools: dict[tuple[str, str], frozenset[GroupKey]]  # FleetState.pool_groups
    classes: dict[str, frozenset[GroupKey]]  # class_groups

    @classmethod
    def of(cls, state: FleetState) -> Footprint:
        return cls(fleet_wide(state), state.pool_groups(), class_groups(state))
