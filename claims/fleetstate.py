"""The in-memory fleet the diagnosis engine reads: raw Kubernetes objects plus the indexes it needs.

Built from files (``kubectl get resourceslices,deviceclasses,resourceclaims,pods -A -o yaml``), from a
list of dicts (tests, simulator) or from the database (the ``raw`` JSON every mirrored row keeps), so the
page, the API, the CLI and the tests all diagnose the same shapes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from claims.allocator import FleetSnapshot
from fleet.normalize import model_family
from fleet.snapshot import read_files

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]

KINDS = (
    "ResourceSlice",
    "DeviceClass",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "Pod",
    "Node",
    "Event",
)


def klog(obj: Obj) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace", "")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def claim_results(claim: Obj) -> list[Obj]:
    """``status.allocation.devices.results`` (empty when not allocated)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return list((alloc.get("devices") or {}).get("results") or [])


@dataclass
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
class FleetState:
    """Raw objects by kind plus lookups. Immutable by convention once built; build a new one per change."""

    objects: dict[str, list[Obj]] = field(default_factory=lambda: {k: [] for k in KINDS})
    cluster: str = ""
    _snapshot: FleetSnapshot | None = field(default=None, repr=False)
    _devices: list[DeviceInfo] | None = field(default=None, repr=False)
    _holders: dict[DeviceKey, list[Obj]] | None = field(default=None, repr=False)
    _pods_by_claim: dict[tuple[str, str], list[Obj]] | None = field(default=None, repr=False)
    _groups: list[list[DeviceInfo]] | None = field(default=None, repr=False)
    # (kind, domain, name) of attributes with many distinct values (uuid, pciBusID, ...)
    high_cardinality: frozenset[tuple[str, str, str]] = frozenset()
    # (selector expression, projection) -> bool | error message, shared by every diagnosis on this state
    results: dict[tuple[str, Any], bool | str] = field(default_factory=dict, repr=False)
    evaluations: int = 0
    saved: int = 0

    @classmethod
    def from_objects(cls, objs: Iterable[Obj], cluster: str = "") -> FleetState:
        state = cls(cluster=cluster)
        for obj in objs:
            kind = obj.get("kind")
            if kind in state.objects:
                state.objects[str(kind)].append(obj)
        return state

    @classmethod
    def from_files(cls, paths: list[str | Path]) -> FleetState:
        """Raises ``fleet.snapshot.SnapshotError`` (with the file name) on unreadable input."""
        return cls.from_objects(read_files(paths))

    @classmethod
    def from_db(cls, cluster: str | None = None) -> FleetState:
        """Every mirrored object of one cluster (or of the only cluster) from its stored raw JSON."""
        from claims import models as cm
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
        sources: list[tuple[str, Any]] = [
            ("ResourceSlice", fm.ResourceSlice),
            ("DeviceClass", fm.DeviceClass),
            ("Node", fm.Node),
            ("ResourceClaim", cm.ResourceClaim),
            ("ResourceClaimTemplate", cm.ResourceClaimTemplate),
            ("Pod", cm.Pod),
            ("Event", cm.SchedulingEvent),
        ]
        objs: list[Obj] = []
        for kind, model in sources:
            for raw in model.objects.filter(cluster=chosen).order_by("name").values_list("raw", flat=True):
                if isinstance(raw, dict):
                    objs.append({**raw, "kind": kind})
        return cls.from_objects(objs, cluster=chosen.name)

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
            self._snapshot = FleetSnapshot.from_objects(
                [
                    *self.objects["ResourceSlice"],
                    *self.objects["DeviceClass"],
                    *self.objects["ResourceClaim"],
                    *self.objects["Node"],
                ]
            )
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
        if self._devices is None:
            newest: dict[tuple[str, str], int] = {}
            for s in self.objects["ResourceSlice"]:
                spec = s.get("spec") or {}
                pool = spec.get("pool") or {}
                key = (spec.get("driver", ""), pool.get("name", ""))
                newest[key] = max(newest.get(key, 0), int(pool.get("generation", 0)))
            out: list[DeviceInfo] = []
            ordered = sorted(
                self.objects["ResourceSlice"],
                key=lambda s: (
                    (s.get("spec") or {}).get("driver", ""),
                    ((s.get("spec") or {}).get("pool") or {}).get("name", ""),
                    (s.get("metadata") or {}).get("name", ""),
                ),
            )
            for s in ordered:
                spec = s.get("spec") or {}
                pool = spec.get("pool") or {}
                driver, pool_name = spec.get("driver", ""), pool.get("name", "")
                if int(pool.get("generation", 0)) != newest[(driver, pool_name)]:
                    continue
                for device in spec.get("devices") or []:
                    attrs = device.get("attributes") or {}
                    product = _string(attrs, "productName", driver)
                    out.append(
                        DeviceInfo(
                            key=(driver, pool_name, str(device.get("name", ""))),
                            device=device,
                            slice=s,
                            node=str(spec.get("nodeName", "")),
                            model=model_family(product) if product else driver,
                            profile=_string(attrs, "profile", driver),
                        )
                    )
            self._devices = out
            self._group_devices(out)
        return self._devices

    def _group_devices(self, devices: list[DeviceInfo]) -> None:
        """Give devices a signature: equal for devices whose low-cardinality data is identical, so a
        selector that reads only such data has one result per signature group."""
        refs: dict[tuple[str, str], tuple[str, str, str]] = {}  # (driver, raw name) -> reference

        def ref_of(driver: str, name: str) -> tuple[str, str, str]:
            found = refs.get((driver, name))
            if found is None:
                found = refs[(driver, name)] = ("attributes", *_qualified(name, driver))
            return found

        distinct: dict[tuple[str, str, str], set[Any]] = {}
        for info in devices:
            driver = info.key[0]
            for name, raw in (info.device.get("attributes") or {}).items():
                values = distinct.setdefault(ref_of(driver, name), set())
                if len(values) <= HIGH_CARDINALITY:
                    values.add(_freeze(raw))
        high = frozenset(ref for ref, values in distinct.items() if len(values) > HIGH_CARDINALITY)
        self.high_cardinality = high
        ids: dict[Any, int] = {}
        groups: list[list[DeviceInfo]] = []
        for info in devices:
            driver = info.key[0]
            attrs = tuple(
                (name, _freeze(raw))
                for name, raw in (info.device.get("attributes") or {}).items()
                if ref_of(driver, name) not in high
            )
            caps = tuple((name, _freeze(raw)) for name, raw in (info.device.get("capacity") or {}).items())
            key = (driver, bool(info.device.get("allowMultipleAllocations")), attrs, caps)
            sig = ids.get(key)
            if sig is None:
                sig = ids[key] = len(groups)
                groups.append([])
            info.sig = sig
            groups[sig].append(info)
        self._groups = groups

    def device_index(self) -> dict[DeviceKey, DeviceInfo]:
        cached: dict[DeviceKey, DeviceInfo] | None = self.__dict__.get("_device_index")
        if cached is None:
            cached = self.__dict__["_device_index"] = {i.key: i for i in self.devices()}
        return cached

    def signature_groups(self) -> list[list[DeviceInfo]]:
        """Devices grouped by signature, each group in allocator order."""
        self.devices()
        assert self._groups is not None
        return self._groups

    def holders(self) -> dict[DeviceKey, list[Obj]]:
        """Claims whose allocation names each device (adminAccess results excluded)."""
        if self._holders is None:
            found: dict[DeviceKey, list[Obj]] = {}
            for claim in self.objects["ResourceClaim"]:
                for r in claim_results(claim):
                    if r.get("adminAccess"):
                        continue
                    key = (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
                    found.setdefault(key, []).append(claim)
            self._holders = found
        return self._holders

    def pods_of_claim(self, claim: Obj) -> list[Obj]:
        """Pods that reference the claim (by name, or via their resourceClaimStatuses), in list order."""
        meta = claim.get("metadata") or {}
        return list(self._pod_index().get((meta.get("namespace", ""), meta.get("name", "")), ()))

    def _pod_index(self) -> dict[tuple[str, str], list[Obj]]:
        # Built once per state: diagnosing every pending claim scanned all pods per claim (38,000 pods x
        # 2,000+ claims on the L fleet: a third of the debounced task's time, bench/README.md "bench_e2e").
        if self._pods_by_claim is None:
            index: dict[tuple[str, str], list[Obj]] = {}
            for pod in self.objects["Pod"]:
                ns = (pod.get("metadata") or {}).get("namespace", "")
                names = {
                    st.get("resourceClaimName")
                    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []
                }
                names |= {
                    rc.get("resourceClaimName") for rc in (pod.get("spec") or {}).get("resourceClaims") or []
                }
                for name in names:
                    index.setdefault((ns, name), []).append(pod)
            self._pods_by_claim = index
        return self._pods_by_claim

    def events_for(self, kind: str, namespace: str, name: str) -> list[Obj]:
        out = []
        for ev in self.objects["Event"]:
            inv = ev.get("involvedObject") or ev.get("regarding") or {}
            if inv.get("kind") == kind and inv.get("name") == name and inv.get("namespace", "") == namespace:
                out.append(ev)
        return out


HIGH_CARDINALITY = 32


def _qualified(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _freeze(raw: Any) -> Any:
    if isinstance(raw, dict):
        if len(raw) == 1:  # the usual {"string": ...} / {"value": ...}
            ((key, value),) = raw.items()
            if not isinstance(value, dict | list):
                return (key, value)
        return tuple(sorted((k, _freeze(v)) for k, v in raw.items()))
    if isinstance(raw, list):
        return tuple(_freeze(v) for v in raw)
    return raw


def _string(attrs: Obj, name: str, driver: str) -> str:
    raw = attrs.get(name) or attrs.get(f"{driver}/{name}") or {}
    return str(raw.get("string", "")) if isinstance(raw, dict) else ""
