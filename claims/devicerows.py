"""A fleet's devices, their signature groups and the facts collected over them, computed pool by pool and
kept between the fleet states of one live fleet (``claims.livestate``).

Listing ~100,000 devices, freezing their attributes into signatures and collecting the fleet-wide facts
(which attributes are high-cardinality, which names are published, which pools publish a device name
twice) took seconds at L, for every state: the incremental diagnosis builds a state per fleet change.
Consecutive states of a live fleet share almost every slice object (only changed rows are read back), so
what a pool's slices yield is computed once per set of slice objects (:class:`PoolRows`) and the
fleet-wide merge walks pools, not devices.

An entry is keyed by the identity of its slices, which it holds (so an id is never reused): a changed
slice is another object, and an empty :class:`DeviceRows` computes what a full one does. Every state goes
through this code, memo or not, so the two paths cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from claims.cel import parse_qualified_name
from fleet.normalize import model_family

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]
Ref = tuple[str, str, str]  # ("attributes", domain, name)
PoolKey = tuple[str, str]  # (driver, pool name)
# (kind "a" or "c", driver, raw name, value type): what the lint's published names are made of
Published = tuple[str, str, str, str]
HIGH_CARDINALITY = 32  # distinct values across the fleet above which an attribute is high-cardinality


def freeze(raw: Any) -> Any:
    """A hashable value equal for equal attribute or capacity values."""
    if isinstance(raw, dict):
        if len(raw) == 1:  # the usual {"string": ...} / {"value": ...}
            ((key, value),) = raw.items()
            if not isinstance(value, dict | list):
                return (key, value)
        return tuple(sorted((k, freeze(v)) for k, v in raw.items()))
    if isinstance(raw, list):
        return tuple(freeze(v) for v in raw)
    return raw


def attr_string(attrs: Obj, name: str, driver: str) -> str:
    raw = attrs.get(name) or attrs.get(f"{driver}/{name}") or {}
    return str(raw.get("string", "")) if isinstance(raw, dict) else ""


@dataclass(slots=True)
class DeviceInfo:
    """One published device with where it lives and how we group it (model family, MIG profile)."""

    key: DeviceKey
    device: Obj
    slice: Obj
    node: str
    model: str
    profile: str  # MIG profile name, "" for a full GPU or a non-GPU device
    sig: int = 0  # devices with the same sig agree on every low-cardinality attribute and capacity


@dataclass
class Layout:
    """The attribute names of a device in its order (devices of one model share it), with what each
    name refers to, and which positions a high-cardinality set keeps."""

    names: tuple[str, ...]
    refs: tuple[Ref, ...]
    kept_for: frozenset[Ref] | None = None
    kept_names: tuple[str, ...] = ()
    keep: Any = None  # (values) -> the kept values, as a tuple

    def keeper(self, high: frozenset[Ref]) -> tuple[tuple[str, ...], Any]:
        """(the kept names, a function of a device's values giving the kept values). Two devices of
        layouts with equal kept names and equal kept values have equal (name, value) pairs."""
        if self.kept_for != high:
            kept = [i for i, ref in enumerate(self.refs) if ref not in high]
            if len(kept) == len(self.refs):
                self.keep = _whole
            elif not kept:
                self.keep = _nothing
            elif len(kept) == 1:
                only = kept[0]
                self.keep = lambda values: (values[only],)
            else:
                self.keep = operator.itemgetter(*kept)
            self.kept_names = tuple(self.names[i] for i in kept)
            self.kept_for = high
        return self.kept_names, self.keep


def _whole(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return values


def _nothing(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return ()


@dataclass
class Numbers:
    """A number per signature key, equal for equal keys. Numbers only grow: a key dropped (:meth:`keep`)
    and seen again is given a new one, never one a kept pool uses."""

    of: dict[Any, int] = field(default_factory=dict)
    top: int = 0

    def __call__(self, key: Any) -> int:
        number = self.of.get(key)
        if number is None:
            number = self.of[key] = self.top
            self.top += 1
        return number

    def keep(self, entries: Iterable[PoolRows]) -> None:
        """Forget the keys none of ``entries`` has."""
        self.of = {k: n for e in entries for k, n in zip(e.local_keys, e.local_numbers, strict=True)}


@dataclass
class PoolRows:
    """What one pool's newest slices yield, with signature keys for one high-cardinality set."""

    slices: tuple[Obj, ...]  # held: their identities are the entry's key
    infos: list[DeviceInfo]  # in allocator order, each with the signature last assigned
    # distinct attribute values in this pool: a shared 1-tuple when there is one (most attributes)
    values: dict[Ref, tuple[Any, ...] | frozenset[Any]]
    published: tuple[Published, ...]  # first occurrences, in device order
    duplicate: str  # the first device name published twice, "" if none
    high: frozenset[Ref]  # the high-cardinality set the signature keys were made for
    local_keys: list[Any]  # distinct signature keys, in order of first device
    # local_keys' numbers (DeviceRows.numbers): a merge looks up an int per key, not a tuple of ~20
    # values hashed again (76,000 keys of 7,600 pools at L: half of a merge)
    local_numbers: list[int]
    local_index: list[int]  # per device, its key's position in local_keys
    groups: frozenset[tuple[str, str]]  # (model, MIG profile) of its devices
    # Its devices that consume counters and are never shared, in device order: those whose holders use
    # up counters (diagnosis.groups.Context), ~40% of the devices at L, 90% at XL
    consumers: list[DeviceInfo] = field(default_factory=list)
    shared: bool = False  # its infos were handed to a state, and so are never changed again
    # The fleet-wide signatures its infos were last numbered with (per local key): a merge whose numbering
    # is the same (most pools, most states) places its devices without checking each one's.
    numbered: list[int] | None = None


def _consumer(info: DeviceInfo) -> bool:
    return bool(info.device.get("consumesCounters")) and not info.device.get("allowMultipleAllocations")


def pool_rows(
    slices: tuple[Obj, ...], interned: dict[Any, Any], high: frozenset[Ref], numbers: Numbers
) -> PoolRows:
    """``slices``: the newest slices of one pool (one driver), in name order. ``interned``: equal
    read-only parts of pools, shared. ``high``: the fleet's high-cardinality attributes as far as the
    caller knows; signature keys leave them out. ``numbers``: the fleet's numbers of signature keys (new
    keys are given one). Each device's frozen values are dropped once its key is made (they were ~40% of
    the rows at XL, most of them unique: serials, bus IDs): a pool whose ``high`` turns out wrong is built
    again (:meth:`DeviceRows.devices`)."""
    # id of a value -> (value, frozen value): lean objects share equal values (fleetstate.lean_object),
    # so most are frozen once per pool. Per pool: a build-wide map would hold every device's unique
    # values (serials, bus IDs) at once.
    frozen: dict[int, Any] = {}

    def freeze_once(raw: Any) -> Any:
        hit = frozen.get(id(raw))
        if hit is None:
            hit = frozen[id(raw)] = (raw, freeze(raw))
        return hit[1]

    layouts: dict[tuple[str, ...], Layout] = {}
    capacities: dict[Any, Any] = {}
    distinct: dict[Ref, set[Any]] = {}
    infos: list[DeviceInfo] = []
    consumers: list[DeviceInfo] = []
    keys: dict[Any, int] = {}
    index: list[int] = []
    published: dict[tuple[str, str], str] = {}  # (kind, name) -> value type; one driver
    names: set[str] = set()
    duplicate = ""
    driver = ""
    for s in slices:
        spec = s.get("spec") or {}
        driver, pool_name = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        node = str(spec.get("nodeName", ""))
        for device in spec.get("devices") or []:
            attrs = device.get("attributes") or {}
            product = attr_string(attrs, "productName", driver)
            name = str(device.get("name", ""))
            if name in names and not duplicate:
                duplicate = name
            names.add(name)
            info = DeviceInfo(
                key=(driver, pool_name, name),
                device=device,
                slice=s,
                node=node,
                model=model_family(product) if product else driver,
                profile=attr_string(attrs, "profile", driver),
            )
            infos.append(info)
            if _consumer(info):
                consumers.append(info)
            attr_names = tuple(attrs)
            layout = layouts.get(attr_names)
            if layout is None:
                refs = tuple(("attributes", *parse_qualified_name(a, driver)) for a in attr_names)
                layout = layouts[attr_names] = Layout(attr_names, refs)
                for a in attr_names:
                    if ("a", a) not in published:
                        raw = attrs[a]
                        published[("a", a)] = next(iter(raw), "") if isinstance(raw, dict) else ""
            values = tuple([freeze_once(v) for v in attrs.values()])
            for ref, value in zip(layout.refs, values, strict=True):
                seen = distinct.get(ref)
                if seen is None:
                    distinct[ref] = {value}
                else:
                    seen.add(value)
            capacity = device.get("capacity") or {}
            for cap in capacity:
                published.setdefault(("c", cap), "quantity")
            caps = tuple(zip(capacity, [freeze_once(v) for v in capacity.values()], strict=True))
            caps = capacities.setdefault(caps, caps)  # devices of one model share theirs: one tuple
            kept_names, keep = layout.keeper(high)
            key = (driver, bool(device.get("allowMultipleAllocations")), kept_names, keep(values), caps)
            index.append(keys.setdefault(key, len(keys)))
    # Kept between states for every pool: sets are large (a 1-value set is 216 bytes, 25 MB at L).
    kept: dict[Ref, tuple[Any, ...] | frozenset[Any]] = {}
    for ref, found in distinct.items():
        if len(found) == 1:
            single = tuple(found)
            kept[ref] = interned.setdefault((ref, single), single)
        else:
            kept[ref] = frozenset(found)
    listed = tuple((k, driver, n, t) for (k, n), t in published.items())
    return PoolRows(
        slices=slices,
        infos=infos,
        values=kept,
        published=interned.setdefault(listed, listed),
        duplicate=duplicate,
        high=high,
        local_keys=list(keys),
        local_numbers=[numbers(k) for k in keys],
        local_index=index,
        groups=frozenset((i.model, i.profile) for i in infos),
        consumers=consumers,
    )


def guess_high(pools: list[tuple[Obj, ...]]) -> frozenset[Ref]:
    """The high-cardinality attributes of these pools' devices, counted straight from their slices: the
    set a first build makes its signature keys for, so that it builds each pool once (a wrong guess costs
    a second build of the pools it was wrong for, nothing else)."""
    distinct: dict[Ref, set[Any]] = {}
    high: set[Ref] = set()
    refs: dict[tuple[str, str], Ref] = {}
    for slices in pools:
        # Lean slices share equal attribute dicts (all of one profile of a GPU) and values: count each
        # once per pool. Ids are safe while the slices, which hold the objects, are alive.
        done: set[int] = set()
        for s in slices:
            spec = s.get("spec") or {}
            driver = spec.get("driver", "")
            for device in spec.get("devices") or []:
                attrs = device.get("attributes") or {}
                if id(attrs) in done:
                    continue
                done.add(id(attrs))
                for name, raw in attrs.items():
                    ref = refs.get((driver, name))
                    if ref is None:
                        ref = refs[(driver, name)] = ("attributes", *parse_qualified_name(name, driver))
                    if ref in high:
                        continue
                    seen = distinct.setdefault(ref, set())
                    seen.add(freeze(raw))
                    if len(seen) > HIGH_CARDINALITY:
                        high.add(ref)
    return frozenset(high)


@dataclass
class Devices:
    """The devices of one fleet state and what was collected over them."""

    infos: list[DeviceInfo]
    groups: list[list[DeviceInfo]]  # by signature, each in allocator order
    high_cardinality: frozenset[Ref]
    published: list[Published]  # first occurrences in device order
    duplicates: list[tuple[PoolKey, str]]  # pools publishing a device name twice, in device order
    by_pool: dict[PoolKey, list[DeviceInfo]]  # each pool's devices, in allocator order
    pool_groups: dict[PoolKey, frozenset[tuple[str, str]]]  # (model, MIG profile) of each pool with devices
    consumers: list[list[DeviceInfo]]  # PoolRows.consumers of the pools with any

    def find(self, key: DeviceKey) -> DeviceInfo | None:
        """The device ``key`` (driver, pool, name): a scan of its pool, which a fleet-wide index by key
        would save at ~75 bytes per device (80 MB at XL, per state) for a lookup made a few times per
        fitting claim."""
        for info in self.by_pool.get((key[0], key[1]), ()):
            if info.key == key:
                return info
        return None


_Place = tuple[Obj, PoolKey, int, str]  # a slice, its pool, its generation, its name
_name = operator.itemgetter(3)


@dataclass
class DeviceRows:
    """Per-pool rows by pool, reused while a pool's slices are the same objects."""

    pools: dict[PoolKey, PoolRows] = field(default_factory=dict)
    interned: dict[Any, Any] = field(default_factory=dict, repr=False)
    interned_limit: int = 4096  # rebuilt from the kept pools above this size
    numbers: Numbers = field(default_factory=Numbers, repr=False)  # pruned with interned
    built: int = 0  # entries computed (not reused), for tests and benchmarks
    high: frozenset[Ref] | None = None  # the fleet's high-cardinality set at the last build
    # Where each slice of the last call stands, by id (the place holds the slice, so an id is not reused
    # meanwhile): most slices of a live fleet's next state are the same objects.
    _places: dict[int, _Place] = field(default_factory=dict, repr=False)

    def devices(self, slices: list[Obj]) -> Devices:
        """The devices of the newest generation of every pool of ``slices``, in allocator order (pool,
        slice, device), with their signatures: equal for devices whose low-cardinality data is identical,
        so a selector that reads only such data has one result per signature group."""
        by_pool: dict[PoolKey, list[_Place]] = {}
        places: dict[int, _Place] = {}
        for s in slices:
            place = self._places.get(id(s))
            if place is None:
                spec = s.get("spec") or {}
                pool = spec.get("pool") or {}
                key = (spec.get("driver", ""), pool.get("name", ""))
                name = (s.get("metadata") or {}).get("name", "")
                place = (s, key, int(pool.get("generation", 0)), name)
            places[id(s)] = place
            by_pool.setdefault(place[1], []).append(place)
        self._places = places
        members_of: dict[PoolKey, tuple[Obj, ...]] = {}
        entries: dict[PoolKey, PoolRows | None] = {}
        for key in sorted(by_pool):
            placed = by_pool[key]
            members: tuple[Obj, ...]
            if len(placed) == 1:  # most pools: one slice (a generation below 0 counts as 0, as below)
                members = (placed[0][0],) if placed[0][2] >= 0 else ()
            else:
                newest = max(0, *(p[2] for p in placed))
                current = sorted((p for p in placed if p[2] == newest), key=_name)
                members = tuple(p[0] for p in current)
            members_of[key] = members
            entry = self.pools.get(key)
            same = (
                entry is not None
                and len(entry.slices) == len(members)
                and all(map(operator.is_, entry.slices, members))
            )
            entries[key] = entry if same else None
        missing = [key for key, entry in entries.items() if entry is None]
        guess = self.high
        if guess is None:
            guess = guess_high([members_of[key] for key in missing])
        for key in missing:
            entries[key] = pool_rows(members_of[key], self.interned, guess, self.numbers)
            self.built += 1
        built = {key: entry for key, entry in entries.items() if entry is not None}
        # The set is a function of the pools' distinct values: the same pools whose rebuilt ones publish
        # the values they did (a taint or a device's other change) have the last set, without a walk of
        # every pool's values (0.03 s at L).
        same_values = built.keys() == self.pools.keys() and all(
            built[key].values == self.pools[key].values for key in missing
        )
        high = self.high if same_values else None
        if high is None:
            high = _high(built.values())
        for key, entry in built.items():
            if entry.high != high:  # made for another set: its keys are not this fleet's
                built[key] = pool_rows(entry.slices, self.interned, high, self.numbers)
                self.built += 1
        self.pools, self.high = built, high  # pools gone from the fleet are dropped
        if max(len(self.interned), len(self.numbers.of)) > self.interned_limit:  # parts of pools long gone
            live: dict[Any, Any] = {}
            for e in built.values():
                live[e.published] = e.published
                live.update(((ref, v), v) for ref, v in e.values.items() if isinstance(v, tuple))
            self.interned, self.interned_limit = live, 2 * len(live) + 4096
            self.numbers.keep(built.values())
        return _merge(list(built.items()), high)


def _high(entries: Iterable[PoolRows]) -> frozenset[Ref]:
    """The attributes with more than HIGH_CARDINALITY distinct values over the pools."""
    distinct: dict[Ref, set[Any]] = {}
    high: set[Ref] = set()
    for entry in entries:
        for ref, found in entry.values.items():
            if ref in high:
                continue
            seen = distinct.get(ref)
            if seen is None:
                seen = distinct[ref] = set(found)
            else:
                seen.update(found)
            if len(seen) > HIGH_CARDINALITY:
                high.add(ref)
    return frozenset(high)


def _merge(entries: list[tuple[PoolKey, PoolRows]], high: frozenset[Ref]) -> Devices:
    """The pools' rows as one fleet's (each pool's keys made for ``high``)."""
    ids: dict[int, int] = {}  # signature key's number -> signature
    groups: list[list[DeviceInfo]] = []
    infos: list[DeviceInfo] = []
    published: list[Published] = []
    seen_names: set[tuple[str, str, str]] = set()
    merged_lists: set[int] = set()
    duplicates: list[tuple[PoolKey, str]] = []
    by_pool: dict[PoolKey, list[DeviceInfo]] = {}
    pool_groups: dict[PoolKey, frozenset[tuple[str, str]]] = {}
    consumers: list[list[DeviceInfo]] = []
    for pool, entry in entries:
        if entry.groups:
            pool_groups[pool] = entry.groups
        sigs = []
        for number in entry.local_numbers:
            sig = ids.get(number)
            if sig is None:
                sig = ids[number] = len(groups)
                groups.append([])
            sigs.append(sig)
        own = entry.infos
        if entry.numbered != sigs:
            for i, local in enumerate(entry.local_index):
                info = own[i]
                sig = sigs[local]
                if info.sig != sig:
                    if entry.shared:  # an earlier state holds it: a renumbered device is a new object
                        own[i] = dataclasses.replace(info, sig=sig)
                    else:
                        info.sig = sig
            entry.numbered = sigs
            if entry.shared:  # devices renumbered above are new objects
                entry.consumers = [i for i in own if _consumer(i)]
        for info, local in zip(own, entry.local_index, strict=True):
            groups[sigs[local]].append(info)
        if entry.consumers:
            consumers.append(entry.consumers)
        entry.shared = True
        infos += own
        by_pool[pool] = list(own)  # a copy: a later state renumbering the pool replaces items of own
        if id(entry.published) not in merged_lists:
            merged_lists.add(id(entry.published))
            for item in entry.published:
                if item[:3] not in seen_names:
                    seen_names.add(item[:3])
                    published.append(item)
        if entry.duplicate:
            duplicates.append((pool, entry.duplicate))
    return Devices(infos, groups, high, published, duplicates, by_pool, pool_groups, consumers)
