"""The in-memory fleet the diagnosis engine reads: raw Kubernetes objects plus the indexes it needs.

Built from files (``kubectl get resourceslices,deviceclasses,resourceclaims,pods -A -o yaml``), from a
list of dicts (tests, simulator) or from the database (the ``raw`` JSON every mirrored row keeps), so the
page, the API, the CLI and the tests all diagnose the same shapes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from claims.allocator import FleetSnapshot
from claims.allocator.baseline import Allocated
from claims.devicerows import DeviceInfo, DeviceKey, DeviceRows, Devices, Published
from claims.keyshared import keyshared
from fleet.normalize import object_as_v1
from fleet.snapshot import read_files
from fleet.taint_rules import patch_slices, rules_of

Obj = dict[str, Any]

KINDS = (
    "ResourceSlice",
    "DeviceClass",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "Pod",
    "Node",
    "Event",
    "DeviceTaintRule",
)


def stored_models() -> list[tuple[str, Any]]:
    """(kind, the fleet model mirroring it), in the order :meth:`FleetState.from_db` reads them."""
    from fleet import models as fm

    return [
        ("ResourceSlice", fm.ResourceSlice),
        ("DeviceClass", fm.DeviceClass),
        ("Node", fm.Node),
        ("ResourceClaim", fm.ResourceClaim),
        ("ResourceClaimTemplate", fm.ResourceClaimTemplate),
        ("Pod", fm.Pod),
        ("Event", fm.SchedulingEvent),
        ("DeviceTaintRule", fm.DeviceTaintRule),
    ]


def klog(obj: Obj) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace", "")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def claim_results(claim: Obj) -> list[Obj]:
    """``status.allocation.devices.results`` (empty when not allocated)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return list((alloc.get("devices") or {}).get("results") or [])


def held_devices(claim: Obj) -> list[DeviceKey]:
    """The devices a claim's allocation holds (adminAccess results excluded), one per result."""
    return [
        (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in claim_results(claim)
        if not r.get("adminAccess")
    ]


def claims_named(pod: Obj) -> set[tuple[str, str]]:
    """(namespace, name) of the claims a pod names: in its status (a claim made from a template) or in
    its spec (a claim made beforehand)."""
    ns = str((pod.get("metadata") or {}).get("namespace") or "")
    names = {
        st.get("resourceClaimName") for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names |= {rc.get("resourceClaimName") for rc in (pod.get("spec") or {}).get("resourceClaims") or []}
    return {(ns, str(n)) for n in names if n}


def pods_by_claim(pods: Iterable[Obj]) -> dict[tuple[str, str], list[Obj]]:
    """Pods by the claims they name, each list in the order of ``pods``."""
    index: dict[tuple[str, str], list[Obj]] = {}
    for pod in pods:
        for key in claims_named(pod):
            index.setdefault(key, []).append(pod)
    return index


def age_key(claim: Obj) -> tuple[str, str]:
    """Where a holder stands among the holders shown, oldest first: creation time, then namespace/name."""
    return (claim.get("metadata") or {}).get("creationTimestamp") or "", klog(claim)


def unreserved(claim: Obj) -> bool:
    """An allocated claim reserved for no consumer (a leaked allocation, or one not used yet)."""
    return not (claim.get("status") or {}).get("reservedFor")


@dataclass(frozen=True)
class HoldersByAge:
    """The claims holding a device (``FleetState.holders``), each once, oldest first (``age_key``); and
    those of them :func:`unreserved`. A diagnosis shows the oldest holders of a group of devices: the
    first of these in the group's holders, where sorting a group's tens of thousands of holders by age
    on each state was a sixth of an update at L."""

    every: list[Obj]
    unreserved: list[Obj]

    @classmethod
    def of(cls, holders: dict[DeviceKey, list[Obj]]) -> HoldersByAge:
        claims = {id(c): c for held in holders.values() for c in held}
        every = sorted(claims.values(), key=age_key)
        return cls(every, [c for c in every if unreserved(c)])


def holders_by_device(claims: Iterable[Obj]) -> dict[DeviceKey, list[Obj]]:
    """Claims by the devices they hold (see :func:`held_devices`), each list in the order of ``claims``."""
    found: dict[DeviceKey, list[Obj]] = {}
    for claim in claims:
        for key in held_devices(claim):
            found.setdefault(key, []).append(claim)
    return found


@dataclass
class FleetState:
    """Raw objects by kind plus lookups. Immutable by convention once built; build a new one per change."""

    objects: dict[str, list[Obj]] = field(default_factory=lambda: {k: [] for k in KINDS})
    cluster: str = ""
    _snapshot: FleetSnapshot | None = field(default=None, repr=False)
    _holders: dict[DeviceKey, list[Obj]] | None = field(default=None, repr=False)
    _by_age: HoldersByAge | None = field(default=None, repr=False)
    _pods_by_claim: dict[tuple[str, str], list[Obj]] | None = field(default=None, repr=False)
    _device_rows: Devices | None = field(default=None, repr=False)
    _allocated_claims: list[Obj] | None = field(default=None, repr=False)  # see from_lists
    # Per-pool rows and the allocator's baseline kept between the states of a live fleet
    # (claims.livestate); None: computed afresh.
    rows: DeviceRows | None = field(default=None, repr=False)
    allocated: Allocated | None = field(default=None, repr=False)
    # (selector expression, projection) -> bool | error message, shared by every diagnosis on this state
    results: dict[tuple[str, Any], bool | str] = field(default_factory=dict, repr=False)
    evaluations: int = 0
    saved: int = 0

    @classmethod
    def from_objects(cls, objs: Iterable[Obj], cluster: str = "") -> FleetState:
        lists: dict[str, list[Obj]] = {k: [] for k in KINDS}
        for obj in objs:
            kind = obj.get("kind")
            if kind in lists:
                # Files may hold v1beta1 objects (kubectl of an older cluster, a driver's quickstart).
                lists[str(kind)].append(object_as_v1(obj))
        return cls.from_lists(lists, cluster)

    @classmethod
    def from_lists(
        cls,
        lists: dict[str, list[Obj]],
        cluster: str = "",
        rows: DeviceRows | None = None,
        links: tuple[dict[tuple[str, str], list[Obj]], dict[DeviceKey, list[Obj]]] | None = None,
        allocated: Allocated | None = None,
        by_age: HoldersByAge | None = None,
        allocated_claims: list[Obj] | None = None,
    ) -> FleetState:
        """A state of v1 objects by kind (the lists are taken, not copied); ``rows``: per-pool rows to
        reuse (see ``claims.devicerows``); ``links``: the pods by claim and the holders by device of these
        lists, kept up to date elsewhere (``claims.livestate``), instead of built here from every pod and
        claim; ``allocated``: the allocator's baseline kept of earlier states (``claims.allocator.baseline``);
        ``by_age``: the holders in age order, kept up to date with ``links``' holders;
        ``allocated_claims``: the claims of ``lists`` with an allocation (``is_allocated``), in any
        order. Neither the dicts nor their lists may change while the state is in use."""
        state = cls(cluster=cluster, rows=rows, allocated=allocated)
        state._allocated_claims = allocated_claims
        if links is not None:
            state._pods_by_claim, state._holders = links
            state._by_age = by_age
        state.objects.update(lists)
        # The scheduler sees slices with the DeviceTaintRules' taints added (fleet.taint_rules), so do we.
        state.objects["ResourceSlice"] = patch_slices(
            state.objects["ResourceSlice"], rules_of(state.objects["DeviceTaintRule"])
        )
        return state

    @classmethod
    def from_files(cls, paths: list[str | Path]) -> FleetState:
        """Raises ``fleet.snapshot.SnapshotError`` (with the file name) on unreadable input."""
        return cls.from_objects(read_files(paths))

    @classmethod
    def from_db(
        cls, cluster: str | None = None, *, lean: bool = False, target: tuple[str, str] | None = None
    ) -> FleetState:
        """Every mirrored object of one cluster (or of the only cluster) from its stored raw JSON.

        ``lean`` keeps of each object only what diagnosing a claim *given from outside* reads (see
        :func:`lean_object`): a what-if's pasted claim, a stored pending claim's own row. The fleet then
        fits in a fifth of the memory (at XL 2 GB instead of 10; bench/README.md "Memory of the diagnosis
        task"). A claim found in a lean state has lost its spec when allocated: ``target`` (namespace,
        name) keeps whole what ``find``-then-diagnose reads (``manage.py explain NAMESPACE/NAME``): the
        claim and the pod of that name, and the claims that pod uses.

        The cyclic collector is left running: web requests load states concurrently and without end,
        and overlapping pauses could keep it off process-wide for as long as requests keep coming."""
        from fleet import models as fm

        clusters = fm.Cluster.objects.all()
        if cluster:
            clusters = clusters.filter(name=cluster)
        found = list(clusters[:2])
        if not found:
            raise LookupError(f"unknown cluster {cluster!r}" if cluster else "no cluster in the database")
        if len(found) > 1 and not cluster:
            raise LookupError("several clusters: choose one with --cluster")
        chosen = found[0]
        whole = _target_keys(chosen, target) if lean and target else {}
        objs: list[Obj] = []
        shared: dict[Any, Any] = {}
        for kind, model in stored_models():
            rows = model.objects.filter(cluster=chosen)
            objs += _stored(kind, rows, shared if lean else None, whole.get(kind, frozenset()))
        return cls.from_objects(objs, cluster=chosen.name)

    def __enter__(self) -> FleetState:
        return self

    def __exit__(self, *exc: object) -> None:
        """``with FleetState.from_db(...) as state:`` releases the state when the block ends."""
        self.release()

    def release(self) -> None:
        """Empty the state now: its objects and every index and cache built on it.

        The diagnosis keeps its per-state context on the state, and the context refers back to the state:
        a reference cycle, so a dropped state is freed only by a full run of the cyclic collector, which a
        worker's next task may start before (two fleets in memory at once: issue 11's 3.9 GB child)."""
        empty = FleetState(cluster=self.cluster)
        self.__dict__.clear()
        self.__dict__.update(empty.__dict__)

    # -- lookups

    def find(self, kind: str, namespace: str, name: str) -> Obj | None:
        for obj in self.objects[kind]:
            meta = obj.get("metadata") or {}
            if meta.get("name") == name and meta.get("namespace", "") == namespace:
                return obj
        return None

    def class_names(self) -> set[str]:
        return {str((c.get("metadata") or {}).get("name", "")) for c in self.objects["DeviceClass"]}

    @property
    def snapshot(self) -> FleetSnapshot:
        if self._snapshot is None:
            self._snapshot = FleetSnapshot.from_kinds(
                list(self.objects["ResourceSlice"]),
                self.objects["DeviceClass"],
                self.objects["ResourceClaim"],
                self.objects["Node"],
                allocated=self._allocated_claims,
            )
            self._snapshot.allocated = self.allocated
        return self._snapshot

    def node_names(self) -> list[str]:
        cached = self.__dict__.get("_node_names")
        if cached is None:
            names = {str((n.get("metadata") or {}).get("name", "")) for n in self.objects["Node"]}
            if not names:
                names = {
                    str((s.get("spec") or {}).get("nodeName", "")) for s in self.objects["ResourceSlice"]
                }
            cached = self.__dict__["_node_names"] = sorted(names - {""})
        return list(cached)

    def devices(self) -> list[DeviceInfo]:
        """Devices of the newest generation of every pool, in allocator order (pool, slice, device)."""
        return self._rows().infos

    def _rows(self) -> Devices:
        if self._device_rows is None:
            self._device_rows = (self.rows or DeviceRows()).devices(self.objects["ResourceSlice"])
        return self._device_rows

    @property
    def high_cardinality(self) -> frozenset[tuple[str, str, str]]:
        """(kind, domain, name) of attributes with many distinct values (uuid, pciBusID, ...)."""
        return self._rows().high_cardinality

    def published(self) -> list[Published]:
        """(kind "a" or "c", driver, raw name, value type) of every attribute and capacity published
        anywhere, first occurrences in device order."""
        return self._rows().published

    def duplicate_devices(self) -> list[tuple[tuple[str, str], str]]:
        """(pool, device name) of the pools that publish a device name twice, the first such name."""
        return self._rows().duplicates

    def device(self, key: DeviceKey) -> DeviceInfo | None:
        """The device ``key`` (driver, pool, name) of the newest generation of its pool, if published."""
        return self._rows().find(key)

    def pool_groups(self) -> dict[tuple[str, str], frozenset[tuple[str, str]]]:
        """Per (driver, pool) with devices in its newest generation: their (model, MIG profile)."""
        return self._rows().pool_groups

    def counter_consumers(self) -> list[list[DeviceInfo]]:
        """Per pool with any: its devices that consume counters and are never shared, in allocator
        order."""
        return self._rows().consumers

    def signature_groups(self) -> list[list[DeviceInfo]]:
        """Devices grouped by signature, each group in allocator order."""
        return self._rows().groups

    def holders(self) -> dict[DeviceKey, list[Obj]]:
        """Claims whose allocation names each device (adminAccess results excluded)."""
        if self._holders is None:
            self._holders = holders_by_device(self.objects["ResourceClaim"])
        return self._holders

    def holders_by_age(self) -> HoldersByAge:
        """The claims of ``holders``, oldest first."""
        if self._by_age is None:
            self._by_age = HoldersByAge.of(self.holders())
        return self._by_age

    def pods_of_claim(self, claim: Obj) -> list[Obj]:
        """Pods that reference the claim (by name, or via their resourceClaimStatuses), in list order."""
        meta = claim.get("metadata") or {}
        return list(self._pod_index().get((meta.get("namespace", ""), meta.get("name", "")), ()))

    def _pod_index(self) -> dict[tuple[str, str], list[Obj]]:
        # Built once per state: diagnosing every pending claim scanned all pods per claim (38,000 pods x
        # 2,000+ claims on the L fleet: a third of the debounced task's time, bench/README.md "bench_e2e").
        if self._pods_by_claim is None:
            self._pods_by_claim = pods_by_claim(self.objects["Pod"])
        return self._pods_by_claim

    def events_for(self, kind: str, namespace: str, name: str) -> list[Obj]:
        out = []
        for ev in self.objects["Event"]:
            inv = ev.get("involvedObject") or ev.get("regarding") or {}
            if inv.get("kind") == kind and inv.get("name") == name and inv.get("namespace", "") == namespace:
                out.append(ev)
        return out


FETCH_CHUNK = 500  # rows per round trip when streaming stored objects


def _target_keys(cluster: Any, target: tuple[str, str]) -> dict[str, frozenset[tuple[str, str]]]:
    """(namespace, name) by kind of what diagnosing the claim or pod ``target`` of ``cluster`` reads whole:
    both of that name, and the claims the pod names (a claim made from a template is named in the pod's
    status only)."""
    from fleet import models as fm

    namespace, name = target
    claims = {(namespace, name)}
    for pod in fm.Pod.objects.filter(cluster=cluster, namespace=namespace, name=name):
        raw = pod.raw if isinstance(pod.raw, dict) else {}
        statuses = (raw.get("status") or {}).get("resourceClaimStatuses") or []
        refs = (raw.get("spec") or {}).get("resourceClaims") or []
        named = [s.get("resourceClaimName") for s in statuses] + [r.get("resourceClaimName") for r in refs]
        claims |= {(namespace, str(n)) for n in named if n}
    return {"ResourceClaim": frozenset(claims), "Pod": frozenset({(namespace, name)})}


def _stored(
    kind: str, rows: Any, shared: dict[Any, Any] | None, whole: frozenset[tuple[str, str]] = frozenset()
) -> list[Obj]:
    """The stored objects of ``rows`` (a queryset of one kind) in name order, each with its ``kind``;
    lean (:func:`lean_object`) when ``shared`` is given, except those ``whole`` names (namespace, name).
    The JSON text is decoded here (orjson) and
    streamed in chunks: Django's JSONField decoding is slower, and a whole kind's rows fetched at once
    would sit in memory next to their decoded objects."""
    from django.db.models import TextField
    from django.db.models.functions import Cast

    # Name, then namespace: a total order, so every load (and claims.livestate) lists a kind alike.
    namespaced = any(f.name == "namespace" for f in rows.model._meta.fields)
    order = ("name", "namespace") if namespaced else ("name",)
    texts = (
        rows.order_by(*order)
        .annotate(raw_text=Cast("raw", TextField()))
        .values_list("raw_text", flat=True)
        .iterator(chunk_size=FETCH_CHUNK)
    )
    out: list[Obj] = []
    for text in texts:
        raw = decode_json(text)
        if isinstance(raw, dict):
            # In the v1 shape first: a lean object has no apiVersion left to convert it by (rows keep what
            # the cluster served, v1beta1 for an older one).
            obj = object_as_v1({**raw, "kind": kind})
            if shared is None or (whole and _key(obj) in whole):
                out.append(obj)
            else:
                out.append(lean_object(obj, shared))
    return out


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


# 19 ASCII digits in a row: maybe an integer beyond 64 bits, which orjson turns into a float (json keeps
# it). Found by mapping every digit byte to "0" and every other byte to "x", then a substring search: both
# run in C over bytes, 15x faster than the regular expression ``[0-9]{19}`` (re steps through the text in
# its engine: 1.5 s of a 15-s load of the L slices). Only ASCII digits make a JSON number.
_DIGITS = bytes(ord("0") if ord("0") <= i <= ord("9") else ord("x") for i in range(256))
_LONG_RUN = b"0" * 19


def decode_json(text: str | None) -> Any:
    """The stored JSON text decoded exactly as ``json.loads`` (Django's JSONField) would, by orjson
    (several times faster) unless the text holds a run of 19 digits or orjson refuses it."""
    if text is None:
        return None
    data = text.encode("utf-8", "surrogatepass")
    if _LONG_RUN not in data.translate(_DIGITS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def _pick(obj: Any, keys: frozenset[str]) -> Any:
    """``obj`` with only ``keys`` (in its own order); anything but an object is kept as it is."""
    return {k: v for k, v in obj.items() if k in keys} if isinstance(obj, dict) else obj


# What the diagnosis, the lint and the allocator replay read of each kind (beyond ``kind``), for
# ``from_db(lean=True)``. Pods: the claims they use, their node selector and the scheduler's message.
# Allocated claims: who holds which device since when (status.allocation.devices.results, reservedFor),
# and the devices' conditions (status.devices, without the driver's data).
_META = frozenset({"name", "namespace", "uid", "creationTimestamp"})
_LEAN_TOP = frozenset({"kind", "metadata", "spec", "status"})
_POD_SPEC = frozenset({"nodeName", "nodeSelector", "resourceClaims", "containers", "initContainers"})
_POD_STATUS = frozenset({"phase", "conditions", "resourceClaimStatuses", "extendedResourceClaimStatus"})
# Of a container: what decides its DRA extended resource requests (claims.diagnosis.extended_resource_claim).
_CONTAINER = frozenset({"name", "resources", "restartPolicy"})
# ``devices``: the per-device conditions binding conditions wait for (claims.diagnosis.binding).
_CLAIM_STATUS = frozenset({"allocation", "reservedFor", "devices"})
_ALLOCATION = frozenset({"devices"})
_ALLOCATED_DEVICES = frozenset({"results"})
# Of a device's status: what claims.diagnosis.binding matches and reads (its ``data`` and ``networkData``
# are the driver's, of any shape and depth).
_DEVICE_STATUS = frozenset({"driver", "pool", "device", "shareID", "conditions"})
_NODE_META = frozenset({"name", "labels"})
_NODE_TOP = frozenset({"kind", "metadata", "spec"})
# Parts of a published device whose values repeat across the fleet (product names, capacities, counters).
_DEVICE_SHARED = ("attributes", "capacity", "consumesCounters", "taints")


def lean_object(obj: Obj, shared: dict[Any, Any]) -> Obj:
    """``obj`` (a fresh decode, changed in place where that is cheaper) keeping what the diagnosis reads.

    Slices keep their spec; equal parts of their devices (``{"string": "NVIDIA B200"}``, and whole equal
    attribute, capacity and counter dicts) become one shared object through ``shared`` (see
    :func:`share_values`): read-only like everything in a FleetState, so sharing is safe. Kinds not listed
    are kept whole."""
    kind = obj.get("kind")
    if kind == "ResourceSlice":
        obj["metadata"] = _compact(_pick(obj.get("metadata"), _META))
        spec = obj.get("spec") or {}
        devices = spec.get("devices")
        for device in devices or []:
            if isinstance(device, dict):
                # Device names repeat on every node of a model (gpu-0-mig-1g10gb-3-0): 60 MB at XL.
                _intern(device, "name")
                for part in _DEVICE_SHARED:
                    if part in device:
                        device[part] = _share_named(device[part], shared)
        if isinstance(devices, list):  # a million at XL, of a few layouts
            spec["devices"] = [keyshared(d) if isinstance(d, dict) else d for d in devices]
        if isinstance(spec.get("sharedCounters"), list):
            # A model's counter sets are the same on every node (15 counters per dynamic-MIG GPU, 8 GPUs
            # a node: 184 MB of the loaded XL fleet): one list, which the diagnosis context also parses once.
            spec["sharedCounters"] = share_values(spec["sharedCounters"], shared)
        return {k: v for k, v in obj.items() if k in _LEAN_TOP}
    if kind == "Pod":
        parts = {"metadata": _META, "spec": _POD_SPEC, "status": _POD_STATUS}
        lean = {k: _pick(v, parts[k]) if k in parts else v for k, v in obj.items() if k in _LEAN_TOP}
        spec, status = lean.get("spec"), lean.get("status")
        if isinstance(status, dict) and isinstance(status.get("conditions"), list):
            # The scheduler's message is all the diagnosis reads of them (placement.scheduled_message);
            # a running pod has four or five more.
            status["conditions"] = [
                c for c in status["conditions"] if not isinstance(c, dict) or c.get("type") == "PodScheduled"
            ]
        if isinstance(spec, dict):
            for key in ("containers", "initContainers"):
                if isinstance(spec.get(key), list):
                    spec[key] = [_pick(c, _CONTAINER) for c in spec[key]]
            # The pods of one workload share their containers, claims and node selector: a third of a
            # lean pod's memory, once per pod otherwise (114,000 pods at XL).
            for key in _POD_SHARED_SPEC:
                if key in spec:
                    spec[key] = share_values(spec[key], shared)
            _intern(spec, "nodeName")
            lean["spec"] = keyshared(spec)  # its parts are shared above
        _intern(status, "phase")
        _intern(lean.get("metadata"), "namespace")
        for part in ("metadata", "status"):
            if part in lean:
                lean[part] = _compact(lean[part])
        return keyshared(lean)
    if kind == "ResourceClaim":
        status = obj.get("status")
        if not (isinstance(status, dict) and status.get("allocation")):
            return obj  # pending claims are few and may be diagnosed from here: keep them whole
        lean_status = _pick(status, _CLAIM_STATUS)
        allocation = lean_status["allocation"] = _pick(status["allocation"], _ALLOCATION)
        if isinstance(allocation, dict) and isinstance(allocation.get("devices"), dict):
            # its config is the driver's, read by no diagnosis
            allocation["devices"] = _pick(allocation["devices"], _ALLOCATED_DEVICES)
        if isinstance(lean_status.get("devices"), list):
            lean_status["devices"] = [_pick(d, _DEVICE_STATUS) for d in lean_status["devices"]]
        for result in claim_results(obj):
            for key in _RESULT_NAMES:
                _intern(result, key)
        meta = _pick(obj.get("metadata"), _META)
        _intern(meta, "namespace")
        return _compact({"kind": kind, "metadata": meta, "status": lean_status})
    if kind == "Node":
        obj["metadata"] = _pick(obj.get("metadata"), _NODE_META)
        return {k: v for k, v in obj.items() if k in _NODE_TOP}
    return obj


# Parts of a pod that its workload's other pods repeat.
_POD_SHARED_SPEC = ("containers", "initContainers", "resourceClaims", "nodeSelector")
# Of an allocation result: names that repeat across claims (the driver, a node's pool, device names).
_RESULT_NAMES = ("driver", "pool", "device", "request")


# Deeper than the lean parts made compact go (a claim's result's tolerations: 8), left as they are: the
# recursion stays bounded whatever a stored object holds.
_COMPACT_DEPTH = 12


def _compact(value: Any, depth: int = 0) -> Any:
    """``value`` with its dicts, innermost first, made :func:`keyshared` (lists rebuilt with them). For
    the parts of lean objects whose keys the API's schema fixes: a free-form map would use up layouts."""
    if depth > _COMPACT_DEPTH:
        return value
    if isinstance(value, dict):
        return keyshared({k: _compact(v, depth + 1) for k, v in value.items()})
    if isinstance(value, list):
        return [_compact(v, depth + 1) for v in value]
    return value


def _intern(obj: Any, key: str) -> None:
    """``obj[key]`` interned (``sys.intern``) when it is a string: one copy of a name many objects repeat.
    Interned strings are freed with their last user."""
    if isinstance(obj, dict):
        value = obj.get(key)
        if type(value) is str:
            obj[key] = sys.intern(value)


def _share_named(values: Any, shared: dict[Any, Any]) -> Any:
    """:func:`share_values` with a fast path for the usual ``{name: {"string": "..."}}`` of attributes
    and capacities (a third of the lean load's time otherwise)."""
    if not isinstance(values, dict):
        return share_values(values, shared)
    out = {}
    # The key of the whole dict, the tuple _flat would make of ``out``, built while its values are shared
    # rather than in a second walk.
    flat: list[Any] = ["{}"]
    whole = True  # every value shared: the dict itself can be
    for name, value in values.items():
        if type(value) is dict and len(value) == 1:
            ((k, v),) = value.items()
            if type(v) in _PLAIN:
                key = (k, type(v), v)
                found = shared.get(key)
                if found is None:  # most are found: a device's own UUID is the one new value
                    found = shared[key] = keyshared(value)
                out[name] = found
                flat += (name, id(found))
                continue
        part, one = _shared(value, shared)
        out[name] = part
        flat += (name, _ref(part))
        whole = whole and one
    # Most attribute dicts are unique (a UUID each): compact even when an equal one is then found.
    out = keyshared(out)
    if not whole:
        return out
    return shared.setdefault(tuple(flat), out)


_PLAIN = (str, int, float, bool)


def share_values(value: Any, shared: dict[Any, Any]) -> Any:
    """``value`` with every dict or list, innermost first, replaced by the first equal one seen in
    ``shared``. The order of keys and the type of each value are part of the equality (``{"int": 1}`` is
    not ``{"int": True}``), so what a reader sees, iteration order included, is unchanged.

    Whole containers are shared, not only leaves: the XL fleet's dynamic-MIG partitions repeat the same
    capacities and counters on every GPU and the same attributes for each profile of a GPU, and a
    device's own dicts were most of the diagnosis state."""
    return _shared(value, shared)[0]


def _shared(value: Any, shared: dict[Any, Any]) -> tuple[Any, bool]:
    """(the shared copy of ``value``, whether it is one: False when some part cannot be hashed)."""
    if isinstance(value, list):
        parts = [_shared(v, shared) for v in value]
        items = [v for v, _ in parts]
        if not all(one for _, one in parts):
            return items, False
        return shared.setdefault(("[]", *(_ref(v) for v in items)), items), True
    if isinstance(value, dict):
        if len(value) == 1:
            # The usual leaf ({"value": "10Gi"}: a dynamic-MIG device's 15 counters) looked up without a
            # call per part, by the key the general path below gives it (and _share_named's fast path).
            # A plain copy: it may be a free-form map (a node selector), whose keys must not make layouts.
            ((k, v),) = value.items()
            if type(v) in _PLAIN:
                key1 = (k, type(v), v)
                found = shared.get(key1)
                if found is None:
                    found = shared[key1] = {k: v}
                return found, True
        parts_of = {k: _shared(v, shared) for k, v in value.items()}
        out = {k: v for k, (v, _) in parts_of.items()}
        if not all(one for _, one in parts_of.values()):
            return out, False
        if not any(isinstance(v, dict | list) for v in out.values()):
            # A dict of plain values keyed by them; one of one entry (here only {k: None}) as the fast
            # paths key it, so all find the same copy.
            entries = tuple((k, type(v), v) for k, v in out.items())
            key: tuple[Any, ...] = entries[0] if len(entries) == 1 else entries
        else:
            key = ("{}", *_flat(out))
        try:
            return shared.setdefault(key, out), True
        except TypeError:  # a key that is not hashable after all
            return out, False
    if value is None or type(value) in _PLAIN:
        return value, True
    return value, False


def shared_more_than_once(shared: dict[Any, Any]) -> dict[Any, Any]:
    """The entries of ``shared`` whose value some two objects hold, for the changes still to come: a value
    held once (a GPU's serial, its profiles' attributes) will not be met again, and its entry (a key as
    large as the value) was a third of the lean slices' memory at XL. By reference count (CPython), less
    what counting adds, measured on a value that only its dict holds. The entries of what a kept value
    contains stay too: an equal value is found by its parts' entries first (its key names their
    identities), so a kept value without them could never be found again."""
    unheld = _references({None: []}, None)
    kept = {k for k in shared if _references(shared, k) > unheld + 1}
    key_of = {id(v): k for k, v in shared.items()}
    todo = [shared[k] for k in kept]
    while todo:
        value = todo.pop()
        for part in value.values() if isinstance(value, dict) else value:
            key = key_of.get(id(part)) if isinstance(part, dict | list) else None
            if key is not None and key not in kept:
                kept.add(key)
                todo.append(part)
    return {k: shared[k] for k in shared if k in kept}


def _references(entries: dict[Any, Any], key: Any) -> int:
    return sys.getrefcount(entries[key])


def _flat(values: dict[str, Any]) -> Iterator[Any]:
    """A shared dict's keys and :func:`_ref` of its values, alternating: one flat key tuple is a third of
    the size of one of pairs, and most of the fleet's containers are unique (serials, bus IDs)."""
    for k, v in values.items():
        yield k
        yield _ref(v)


def _ref(value: Any) -> Any:
    """What stands for a value in its container's key: a shared container by its identity (it lives as
    long as ``shared``, which holds it), a plain value by its type and itself."""
    return id(value) if isinstance(value, dict | list) else (type(value), value)
