"""Candidate groups and the per-fleet context: devices grouped by model x MIG profile, the state outcomes
of a batch of devices, who holds a device (oldest first), and the per-state facts shared by every request
(pool problems, counters left, holders).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import compress, count

from claims.allocator.pools import generation
from claims.diagnosis.requests import Req, counter_value
from claims.diagnosis.result import Obj
from claims.fleetstate import DeviceInfo, DeviceKey, FleetState, age_key, claim_results, unreserved
from fleet.quantity import parse_quantity

log = logging.getLogger(__name__)

# Which part of a signature group a batch of devices is (analysis.analyze): None for the whole group,
# else the node set it was cut to, tagged "skipped" for the devices split off as skipped from it (unless
# all of it is: then it is the part itself).
Part = frozenset[str] | tuple[str, object] | None
SummaryKey = tuple[int, int, DeviceKey, DeviceKey, str, Part]


@dataclass
class Group:
    model: str
    profile: str
    total: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    miss: tuple[str, str] | None = None
    holders: dict[int, Obj] = field(default_factory=dict)  # by id; filled while summarizing (a scratch group)
    free_nodes: dict[str, int] = field(default_factory=dict)
    taints: dict[str, int] = field(default_factory=dict)
    pool_problems: set[str] = field(default_factory=set)
    # The summaries whose holders this group has: they are shared by every claim of the same shape, so the
    # union of their holders (and its oldest) is computed once per state, see Context.holders_of.
    sources: list[Summary] = field(default_factory=list)


@dataclass
class Summary:
    """State outcomes of a batch of devices that passed the selectors."""

    outcomes: dict[str, int] = field(default_factory=dict)
    free_nodes: dict[str, int] = field(default_factory=dict)
    taints: dict[str, int] = field(default_factory=dict)
    holders: dict[int, Obj] = field(default_factory=dict)  # by id
    pool_problems: set[str] = field(default_factory=set)
    candidate_nodes: set[str] = field(default_factory=set)
    free: list[DeviceInfo] = field(default_factory=list)


def shares_of(info: DeviceInfo, held: list[Obj]) -> list[Obj] | None:
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


def summary_key(batch: list[DeviceInfo], req: Req, part: Part) -> SummaryKey:
    """The key of ``batch``'s summary in ``Context.summaries``: within a state, the signature and the part
    of its group name the devices; what else a summary reads of the request is its tolerations and
    admin access."""
    return (batch[0].sig, len(batch), batch[0].key, batch[-1].key, repr((req.tolerations, req.admin)), part)


HOLDERS_SHOWN = 20


def oldest(
    claims: list[Obj], keys: list[tuple[str, str]], n: int = HOLDERS_SHOWN, only: Iterable[bool] | None = None
) -> list[Obj]:
    """``sorted(claims, key=age_key)[:n]`` given each claim's ``age_key`` (``keys``), of the claims
    ``only`` flags when given. A group's holders are up to tens of thousands of claims of which a diagnosis
    shows the first few: a heap of n, fed without a Python call per claim (sorting every holder by its
    key, the name formatted per claim, was a sixth of an update under churn). The index breaks ties as
    the stable sort does."""
    pairs: Iterable[tuple[tuple[str, str], int]] = zip(keys, count(), strict=False)
    if only is not None:
        pairs = compress(pairs, only)
    return [claims[i] for _, i in heapq.nsmallest(n, pairs)]


# Below one holder in this many of the state's, a group's holders are ordered by themselves.
SPARSE_HOLDERS = 8


def _first_of(order: list[Obj], members: dict[int, Obj]) -> list[Obj]:
    """The first HOLDERS_SHOWN claims of ``order`` that are ``members`` (by id)."""
    out: list[Obj] = []
    for claim in order:
        if id(claim) in members:
            out.append(claim)
            if len(out) == HOLDERS_SHOWN:
                break
    return out


@dataclass(frozen=True)
class Holders:
    every: dict[int, Obj]  # by id
    oldest: list[Obj]  # the HOLDERS_SHOWN oldest holders, oldest first
    unreserved: list[Obj]  # the HOLDERS_SHOWN oldest of those reserved for no consumer


@dataclass(frozen=True)
class CountersLeft:
    """What is left of each shared counter (driver, pool, counter set, counter): the pool's published
    value (shared by every pool publishing an equal list) less what allocated devices consume."""

    published: dict[tuple[str, str], dict[tuple[str, str], Fraction]]  # by pool: (set, counter) -> value
    left: dict[tuple[str, str, str, str], Fraction]  # of the counters some device consumes

    def get(self, ck: tuple[str, str, str, str], default: Fraction | int = 0) -> Fraction | int:
        left = self.left.get(ck)
        if left is not None:
            return left
        return self.published.get((ck[0], ck[1]), {}).get((ck[2], ck[3]), default)


@dataclass
class Context:
    """Per-state facts shared by all requests: pool problems, counter usage, device holders."""

    state: FleetState
    pool_problem: dict[tuple[str, str], str]
    counter_left: CountersLeft
    used_sets: set[tuple[str, str, str]] = field(default_factory=set)
    splits: dict[tuple[DeviceKey, DeviceKey, int, Part], tuple[list[DeviceInfo], list[DeviceInfo]]] = field(
        default_factory=dict
    )
    summaries: dict[SummaryKey, Summary] = field(default_factory=dict)
    # holders_of's results by the identities of the summaries; the summaries are kept alive with them, so
    # an id is never reused while its entry exists.
    holder_sets: dict[tuple[int, ...], tuple[list[Summary], Holders]] = field(default_factory=dict)
    _consumption: dict[DeviceKey, list[tuple[tuple[str, str, str, str], Fraction | int]]] = field(
        default_factory=dict
    )

    def holders_of(self, groups: Iterable[Group]) -> Holders:
        """The claims holding the groups' devices: all of them, and the HOLDERS_SHOWN oldest (of all, and
        of those reserved for no consumer). Claims of the same shape share their summaries: this runs once
        per shape, not once per claim over tens of thousands of holders."""
        sources = [s for g in groups for s in g.sources]
        key = tuple(id(s) for s in sources)
        hit = self.holder_sets.get(key)
        if hit is not None:
            return hit[1]
        every: dict[int, Obj] = {}
        for s in sources:
            every.update(s.holders)
        # Every summary's holders are the state's (analysis reads them from state.holders()): the first
        # of the state's holders by age that are the groups', unless the groups have so few of them that
        # ordering just theirs costs less than the walk.
        order = self.state.holders_by_age()
        held = None
        if len(every) * SPARSE_HOLDERS >= len(order.every):
            held = Holders(every, _first_of(order.every, every), _first_of(order.unreserved, every))
            if len(held.oldest) < min(HOLDERS_SHOWN, len(every)):
                # A holder missing from the state's order (a kept order out of step with the holders):
                # shown from the holders themselves rather than silently short.
                log.warning(
                    "holders by age of cluster %r miss some of %d holders", self.state.cluster, len(every)
                )
                held = None
        if held is None:
            claims = list(every.values())
            keys = list(map(age_key, claims))
            held = Holders(every, oldest(claims, keys), oldest(claims, keys, only=map(unreserved, claims)))
        cached = {id(v) for v in self.summaries.values()}
        if all(i in cached for i in key):
            # Else a summary made for this request alone (capacity requests, single devices): nothing to
            # share.
            self.holder_sets[key] = (sources, held)
        return held

    @classmethod
    def of(cls, state: FleetState) -> Context:
        cached = getattr(state, "_diagnosis_context", None)
        if isinstance(cached, cls):
            return cached
        problems: dict[tuple[str, str], str] = {}
        counts: dict[tuple[str, str], tuple[int, int]] = {}  # pool -> (generation, slices seen)
        wanted: dict[tuple[str, str], int] = {}
        for s in state.objects["ResourceSlice"]:
            spec = s.get("spec") or {}
            pool = spec.get("pool") or {}
            key = (spec.get("driver", ""), pool.get("name", ""))
            gen = generation(s)
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
        for pool_key, name in state.duplicate_devices():
            if pool_key not in problems:
                problems[pool_key] = f"pool {pool_key[0]}/{pool_key[1]} is invalid: duplicate device {name}"
        # Counter sets repeat on every node of a model (a dynamic-MIG GPU's 15 counters, 8 GPUs a node:
        # a million counters at XL) and lean slices share equal lists (fleetstate.lean_object): each
        # distinct list is parsed once, and a pool's counters are that parse, not a copy per counter.
        lists: dict[int, tuple[object, dict[tuple[str, str], Fraction]]] = {}
        values: dict[int, tuple[object, Fraction]] = {}  # one Fraction per stored value (shared too)

        def quantity(value: object) -> Fraction:
            hit = values.get(id(value))
            if hit is None:  # the value is kept in the tuple, so its id is not reused meanwhile
                raw = value.get("value", "0") if isinstance(value, dict) else "0"
                hit = values[id(value)] = (value, parse_quantity(str(raw)).value)
            return hit[1]

        base: dict[tuple[str, str], dict[tuple[str, str], Fraction]] = {}
        for s in state.objects["ResourceSlice"]:
            spec = s.get("spec") or {}
            sets = spec.get("sharedCounters")
            if not sets:
                continue
            pool_key = (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))
            if generation(s) != counts[pool_key][0]:
                # An older generation's slice, left until the driver deletes it: the allocator reads
                # the newest generation's counters only.
                continue
            found = lists.get(id(sets))
            if found is None:
                parsed = {
                    (cs.get("name", ""), cname): quantity(value)
                    for cs in sets
                    for cname, value in (cs.get("counters") or {}).items()
                }
                found = lists[id(sets)] = (sets, parsed)
            before = base.get(pool_key)  # several slices of a pool: later ones win, as one dict would
            base[pool_key] = found[1] if before is None else {**before, **found[1]}
        holders = state.holders()
        used: set[tuple[str, str, str]] = set()
        consumed: dict[tuple[str, str, str, str], Fraction] = {}
        for pool_consumers in state.counter_consumers():  # one pool's devices each
            driver, pool_name, _ = pool_consumers[0].key
            pool_counters = base.get((driver, pool_name)) or {}
            for info in pool_consumers:
                if info.key not in holders:
                    continue
                for use in info.device["consumesCounters"]:
                    counter_set = use.get("counterSet", "")
                    used.add((driver, pool_name, counter_set))
                    for cname, value in (use.get("counters") or {}).items():
                        if (counter_set, cname) in pool_counters:
                            ck = (driver, pool_name, counter_set, cname)
                            consumed[ck] = consumed.get(ck, 0) + quantity(value)
        counters = CountersLeft(
            base, {ck: base[(ck[0], ck[1])][(ck[2], ck[3])] - n for ck, n in consumed.items()}
        )
        ctx = cls(state, problems, counters, used)
        object.__setattr__(state, "_diagnosis_context", ctx)
        return ctx

    def consumption(self, info: DeviceInfo) -> list[tuple[tuple[str, str, str, str], Fraction | int]]:
        cached = self._consumption.get(info.key)
        if cached is None:
            cached = [
                ((info.key[0], info.key[1], use.get("counterSet", ""), cname), counter_value(value))
                for use in info.device.get("consumesCounters") or []
                for cname, value in (use.get("counters") or {}).items()
            ]
            self._consumption[info.key] = cached
        return cached

    def split_skipped(
        self, batch: list[DeviceInfo], part: Part = None
    ) -> tuple[list[DeviceInfo], list[DeviceInfo]]:
        """(devices the allocator skips before their selectors: in use or in an unusable pool; the rest)
        of ``batch``, the ``part`` of its signature group (or one device)."""
        key = (batch[0].key, batch[-1].key, len(batch), part)
        found = self.splits.get(key)
        if found is None:
            holders = self.state.holders()
            skipped: list[DeviceInfo] = []
            rest: list[DeviceInfo] = []
            problems = self.pool_problem
            for i in batch:
                held = holders.get(i.key)
                # shares_of is None for every held device that allows no sharing (most): not called for it
                in_use = held and (not i.device.get("allowMultipleAllocations") or shares_of(i, held) is None)
                if in_use or (problems and (i.key[0], i.key[1]) in problems):
                    skipped.append(i)
                else:
                    rest.append(i)
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
