"""The lean fleet of one cluster kept in memory and brought up to date by ingest's change events.

A change event names the keys a committed batch wrote and deleted (``fleet.ingest.events.change_event``);
:meth:`LiveFleet.apply` reads just those rows back (their stored raw JSON, made lean exactly as
``FleetState.from_db(lean=True)`` does) instead of the whole fleet, and says what the batch reached: the
pools whose devices or holders changed (old and new), the claims whose own object or pods changed, or
everything (a relist too large to name its keys, a class or node change). :func:`affected` turns that
into the pending claims to diagnose again (``claims.diagnosis.footprint``). Reading and deciding only:
the diagnosis task (``claims.tasks``) writes.

Applying an event twice is harmless (the rows are read back as they are now), so a worker that is not
sure which events it saw reloads, or replays a few too many.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from claims.allocator.baseline import Allocated
from claims.allocator.snapshot import is_allocated
from claims.devicerows import DeviceRows
from claims.diagnosis.footprint import Footprint, GroupKey, class_names
from claims.fleetstate import (
    KINDS,
    DeviceKey,
    FleetState,
    HoldersByAge,
    Obj,
    _stored,
    age_key,
    claim_results,
    claims_named,
    held_devices,
    holders_by_device,
    pods_by_claim,
    shared_more_than_once,
    stored_models,
    unreserved,
)
from fleet.ingest.sql import key_clauses

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds
# Kinds a pending claim's diagnosis reads; a template or an event never changes one.
READ = ("ResourceSlice", "DeviceClass", "Node", "ResourceClaim", "Pod", "DeviceTaintRule")  # from_db's order
FETCH_KEYS = 500  # keys per query when reading changed rows back


def _models() -> dict[str, Any]:
    return dict(stored_models())


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def parse_key(text: str) -> Key:
    """An event's ``"namespace/name"`` or ``"name"``."""
    ns, sep, name = text.partition("/")
    return (ns, name) if sep else ("", ns)


@dataclass
class Reach:
    """What a set of change events reached."""

    everything: bool = False
    pools: set[tuple[str, str]] = field(default_factory=set)
    claims: set[Key] = field(default_factory=set)  # claims whose own object or pods changed

    def __bool__(self) -> bool:
        return self.everything or bool(self.pools or self.claims)


def _claim_pools(claim: Obj | None) -> set[tuple[str, str]]:
    return {(str(r.get("driver", "")), str(r.get("pool", ""))) for r in claim_results(claim or {})}


def _slice_pool(obj: Obj | None) -> set[tuple[str, str]]:
    spec = (obj or {}).get("spec") or {}
    return {(str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))} if obj else set()


def _pod_claims(pod: Obj | None) -> set[Key]:
    return claims_named(pod) if pod else set()


def _order(obj: Obj) -> Key:
    """Where an object stands in its kind's list (FleetState.from_db's order: name, then namespace)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or ""), str(meta.get("namespace") or "")


def _unlink(index: dict[Any, list[Obj]], key: Any, obj: Obj) -> None:
    # A new list, not the old one changed: a state made before keeps the lists it was given.
    kept = [o for o in index.get(key, ()) if o is not obj]
    if kept:
        index[key] = kept
    else:
        index.pop(key, None)


def _link(index: dict[Any, list[Obj]], key: Any, obj: Obj) -> None:
    held = list(index.get(key, ()))
    held.insert(bisect.bisect_right(held, _order(obj), key=_order), obj)
    index[key] = held


@dataclass
class _ByAge:
    """The holders in ``HoldersByAge``'s order, kept claim by claim. A claim is found by bisection on the
    age keys, made per probe rather than kept beside the claims (~25 MB at XL); of claims with one key
    (one fleet holds none: its claims' names differ) the one removed is told by identity."""

    claims: list[Obj] = field(default_factory=list)
    free: list[Obj] = field(default_factory=list)

    @classmethod
    def of(cls, holders: dict[DeviceKey, list[Obj]]) -> _ByAge:
        order = HoldersByAge.of(holders)
        return cls(order.every, order.unreserved)

    def add(self, claim: Obj) -> None:
        key = age_key(claim)
        for claims in self._lists(claim):
            claims.insert(bisect.bisect_right(claims, key, key=age_key), claim)

    def remove(self, claim: Obj) -> None:
        key = age_key(claim)
        for claims in self._lists(claim):
            i = bisect.bisect_left(claims, key, key=age_key)
            while i < len(claims) and claims[i] is not claim and age_key(claims[i]) == key:
                i += 1
            if i < len(claims) and claims[i] is claim:
                del claims[i]

    def _lists(self, claim: Obj) -> list[list[Obj]]:
        return [self.claims, self.free] if unreserved(claim) else [self.claims]

    def snapshot(self) -> HoldersByAge:
        """Copies: a state keeps its lists while this one changes."""
        return HoldersByAge(list(self.claims), list(self.free))


class _Added(dict[Any, Any]):
    """The values a read brings that ``kept`` lacks, sharing ``kept``'s: every lookup finds a value in
    ``kept`` first, and a new one is entered here only (so no key is in both). No value is None."""

    def __init__(self, kept: dict[Any, Any]) -> None:
        super().__init__()
        self.kept = kept

    def __contains__(self, key: object) -> bool:
        return key in self.kept or super().__contains__(key)

    def __getitem__(self, key: Any) -> Any:
        found = self.kept.get(key)
        return super().__getitem__(key) if found is None else found

    def get(self, key: Any, default: Any = None) -> Any:
        found = self.kept.get(key)
        return super().get(key, default) if found is None else found

    def setdefault(self, key: Any, default: Any = None) -> Any:
        found = self.kept.get(key)
        return super().setdefault(key, default) if found is None else found


@dataclass
class LiveFleet:
    """The lean objects of one cluster by kind and key."""

    cluster: str
    cluster_id: int
    objects: dict[str, dict[Key, Obj]] = field(default_factory=lambda: {k: {} for k in KINDS})
    shared: dict[Any, Any] = field(default_factory=dict, repr=False)
    rows: DeviceRows = field(default_factory=DeviceRows, repr=False)
    allocated: Allocated = field(default_factory=Allocated, repr=False)
    # Each kind's objects in FleetState.from_db's order, once asked for, and their sort keys (name,
    # namespace): a change puts its object in place rather than sorting the kind again (40,000 claims and
    # as many pods at L, on every update under churn).
    _ordered: dict[str, list[Obj]] = field(default_factory=dict, repr=False)
    _sort_keys: dict[str, list[Key]] = field(default_factory=dict, repr=False)
    # Pods by the claims they name, claims by the devices they hold: what a state would build by walking
    # every pod and claim on each update (0.2 s each at L), kept up to date object by object instead.
    pods_by_claim: dict[Key, list[Obj]] = field(default_factory=dict, repr=False)
    holders: dict[DeviceKey, list[Obj]] = field(default_factory=dict, repr=False)
    by_age: _ByAge = field(default_factory=_ByAge, repr=False)  # the claims of holders, oldest first
    # The claims with an allocation, for the allocator's snapshot, which would otherwise filter all 40,000
    # claims at L on every state (a few percent of an update under churn). In no order: the allocator
    # reads them as sums and sets (claims.allocator.baseline).
    allocated_claims: dict[Key, Obj] = field(default_factory=dict, repr=False)
    # Per kind, the number of the last change event logged before the kind was last read whole: what that
    # read saw includes every event up to it, because an event is logged after its batch commits and the
    # read runs outside a transaction, at read committed, so its snapshot is taken after the number.
    # An initial sync logs one relist per kind while the first load runs (minutes at XL): this keeps the
    # update after the load from reading whole again the kinds the load read after their relist.
    read_at: dict[str, int] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, cluster: str, mark: Callable[[], int] | None = None) -> LiveFleet:
        """Every object of ``cluster`` the diagnosis reads. Raises LookupError for an unknown cluster.
        ``mark``: the number of the newest logged change event (``changelog.position``), taken before
        each kind is read, so that :meth:`apply` skips the events the load already saw."""
        from fleet.gcpause import cyclic_gc_paused
        from fleet.models import Cluster

        found = Cluster.objects.filter(name=cluster).first()
        if found is None:
            raise LookupError(f"unknown cluster {cluster!r}")
        live = cls(cluster, found.pk)
        with cyclic_gc_paused():
            for kind in READ:
                if mark is not None:
                    live.read_at[kind] = mark()
                live._reload(kind)
        live.shared = shared_more_than_once(live.shared)
        return live

    def size(self) -> int:
        """How many objects the fleet holds."""
        return sum(len(table) for table in self.objects.values())

    def _reload(self, kind: str) -> None:
        # The kind's objects go before it is read again, with what holds them (indexes, the device
        # rows, the allocator's sums): a relist too large to name its keys would otherwise hold the kind
        # twice for the time of the read (the slices: +0.6 GB at XL). Every object is a new one after
        # it, so what holds them would be made again anyway; made from nothing, as a load makes it.
        self.objects[kind] = {}
        self._ordered.pop(kind, None)
        self._sort_keys.pop(kind, None)
        if kind == "Pod":
            self.pods_by_claim = {}
        elif kind == "ResourceClaim":
            self.holders, self.by_age, self.allocated_claims = {}, _ByAge(), {}
            self.allocated = Allocated()
        elif kind == "ResourceSlice":
            self.rows, self.allocated = DeviceRows(), Allocated()
        rows = _models()[kind].objects.filter(cluster_id=self.cluster_id)
        self.objects[kind] = {key_of(o): o for o in _stored(kind, rows, self.shared)}
        if kind == "Pod":
            self.pods_by_claim = pods_by_claim(self._ordered_list(kind))
        elif kind == "ResourceClaim":
            self.holders = holders_by_device(self._ordered_list(kind))
            self.by_age = _ByAge.of(self.holders)
            self.allocated_claims = {k: o for k, o in self.objects[kind].items() if is_allocated(o)}

    def _ordered_list(self, kind: str) -> list[Obj]:
        ordered = self._ordered.get(kind)
        if ordered is None:
            table = self.objects[kind]
            keys = self._sort_keys[kind] = sorted((name, ns) for ns, name in table)
            ordered = self._ordered[kind] = [table[(ns, name)] for name, ns in keys]
        return ordered

    def _replace(self, kind: str, key: Key, new: Obj | None) -> Obj | None:
        """Put ``new`` (None: nothing) in place of the object ``key`` of ``kind``, with its index entries;
        returns the object it replaced."""
        table = self.objects[kind]
        old = table.get(key)
        if new is None:
            table.pop(key, None)
        else:
            table[key] = new
        ordered = self._ordered.get(kind)
        if ordered is not None:  # a state's lists are copies: this one may change in place
            keys, at = self._sort_keys[kind], (key[1], key[0])
            i = bisect.bisect_left(keys, at)
            found = i < len(keys) and keys[i] == at
            if new is None:
                if found:
                    del keys[i], ordered[i]
            elif found:
                ordered[i] = new
            else:
                keys.insert(i, at)
                ordered.insert(i, new)
        if kind == "ResourceClaim":
            if new is not None and is_allocated(new):
                self.allocated_claims[key] = new
            else:
                self.allocated_claims.pop(key, None)
        self._relink(kind, old, new)
        return old

    def _relink(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Move one pod's or claim's entries in the indexes from ``old`` to ``new`` (either may be None)."""
        if kind == "Pod":
            index: dict[Any, list[Obj]] = self.pods_by_claim
            keys_of: Any = claims_named
        elif kind == "ResourceClaim":
            index, keys_of = self.holders, held_devices
            if old is not None and held_devices(old):
                self.by_age.remove(old)
            if new is not None and held_devices(new):
                self.by_age.add(new)
        else:
            return
        if old is not None:
            for key in set(keys_of(old)):
                _unlink(index, key, old)
        if new is not None:
            for key in keys_of(new):  # a claim holding two shares of a device is listed twice
                _link(index, key, new)

    def _read(self, kind: str, keys: list[Key]) -> dict[Key, Obj]:
        """The stored objects of ``keys`` (those still stored), lean, sharing what the fleet shares. Of
        the values changed slices bring that ``shared`` lacks, only those two objects hold stay, as the
        load leaves them: their serials and UUIDs, kept as entries, would grow ``shared`` by every value
        the churn republished until the next full recompute (+60 MB at L for one rewrite of every slice).
        Other kinds keep every new value: a workload's pods arrive one batch at a time and share what
        the first one brought."""
        if kind != "ResourceSlice":
            return self._read_into(kind, keys, self.shared)
        new = _Added(self.shared)
        out = self._read_into(kind, keys, new)
        for key, value in shared_more_than_once(new).items():  # keys new to shared: nothing replaced
            self.shared.setdefault(key, value)
        return out

    def _read_into(self, kind: str, keys: list[Key], shared: dict[Any, Any]) -> dict[Key, Obj]:
        model = _models()[kind]
        namespaced = any(f.name == "namespace" for f in model._meta.fields)
        wanted = set(keys)
        out: dict[Key, Obj] = {}
        columns = ("namespace", "name") if namespaced else ("name",)
        stored = model.objects.filter(cluster_id=self.cluster_id)
        for start in range(0, len(keys), FETCH_KEYS):
            chunk = keys[start : start + FETCH_KEYS]
            for where, params in key_clauses(columns, [k if namespaced else k[1:] for k in chunk]):
                for obj in _stored(kind, stored.extra(where=[where], params=params), shared):
                    key = key_of(obj)
                    if key in wanted:
                        out[key] = obj
        return out

    def state(self) -> FleetState:
        """A FleetState of the current objects, each kind in the order ``FleetState.from_db`` lists it,
        reusing the per-pool device rows of the previous states."""
        lists = {kind: list(self._ordered_list(kind)) for kind in READ}
        # Copies of the dicts (the lists in them are replaced, never changed: see _link).
        links = (dict(self.pods_by_claim), dict(self.holders))
        return FleetState.from_lists(
            lists,
            cluster=self.cluster,
            rows=self.rows,
            links=links,
            allocated=self.allocated,
            by_age=self.by_age.snapshot(),
            allocated_claims=list(self.allocated_claims.values()),
        )

    def apply(self, events: Iterable[tuple[int, dict[str, Any]]]) -> Reach:
        """Bring the objects up to date with ``events`` (this cluster's ``fleet.change`` events with their
        log numbers, in commit order, as ``changelog.read`` gives them); returns what they reached."""
        reach = Reach()
        written: dict[str, set[Key]] = {}
        reloaded = False
        numbered = list(events)
        last = max((number for number, _ in numbered), default=0)
        for number, event in numbered:
            kind = str(event.get("kind", ""))
            # Already in what the kind's last whole read saw (an import: in what every kind's did).
            if number <= min(self.read_at.get(k, -1) for k in ([kind] if kind in READ else READ)):
                continue
            # A relist's event names its keys when few (fleet.ingest.events): then it is applied key by
            # key like a watch batch; else the kind is read again whole.
            whole = event.get("resync") and not isinstance(event.get("written"), list)
            if event.get("imported") or (kind in READ and whole):
                reach.everything = True
                reloaded = True
                for k in [kind] if kind in READ else READ:
                    self._reload(k)
                    # Every event given was logged before this read: none of this kind needs applying.
                    self.read_at[k] = last
                    written.pop(k, None)
                continue
            if kind not in READ:
                continue
            keys = written.setdefault(kind, set())
            keys.update(parse_key(k) for k in [*event.get("written", []), *event.get("deleted", [])])
        if reloaded:  # what only the objects reloaded held goes with them, as after a load
            self.shared = shared_more_than_once(self.shared)
        for kind, keys in written.items():
            if not keys:
                continue
            fresh = self._read(kind, sorted(keys))
            for key in keys:
                new = fresh.get(key)
                old = self._replace(kind, key, new)
                if old == new:
                    continue
                if kind in ("DeviceClass", "Node", "DeviceTaintRule"):  # a rule may taint any pool
                    reach.everything = True
                elif kind == "ResourceSlice":
                    reach.pools |= _slice_pool(old) | _slice_pool(new)
                elif kind == "ResourceClaim":
                    reach.claims.add(key)
                    reach.pools |= _claim_pools(old) | _claim_pools(new)
                elif kind == "Pod":
                    reach.claims |= _pod_claims(old) | _pod_claims(new)
        return reach


def affected(before: Footprint, after: Footprint, reach: Reach, pending: dict[Key, Obj]) -> set[Key] | None:
    """The pending claims (``pending``: key -> claim object) whose diagnosis ``reach`` may have changed,
    between the fleet ``before`` and ``after`` the events; None when every one may have."""
    if reach.everything:
        return None
    out = {k for k in reach.claims if k in pending}
    if not reach.pools:
        return out
    if before.wide != after.wide:
        return None
    touched: set[GroupKey] = set()
    for footprint in (before, after):
        for pool in reach.pools:
            touched |= footprint.pools.get(pool, frozenset())
    if not touched:
        return out
    reached = set()
    for footprint in (before, after):
        for name, groups in footprint.classes.items():
            if groups & touched:
                reached.add(name)
    for key, claim in pending.items():
        if class_names(claim) & reached:
            out.add(key)
    return out
