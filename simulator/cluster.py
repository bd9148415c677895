"""An in-memory Kubernetes API for the simulator: list + watch with etcd-like resourceVersions.

`SimulatedCluster` implements the same `Source` protocol the reflector uses against a real API server:
- one monotonic integer resourceVersion across all kinds (like etcd's revision);
- `list(kind)` returns the current objects and the cluster's current resourceVersion;
- `watch(kind, rv)` replays every change after `rv` from a bounded history, then a BOOKMARK; if `rv` is
  older than the history keeps (compaction), it yields a single ERROR event carrying a 410 `Expired` Status,
  exactly what a client must handle by relisting.

Objects are stored as given (plus metadata.resourceVersion) and replaced, never mutated in place, so the dicts
handed out by `list`/`watch` stay valid snapshots. Callers must treat them as read-only.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fleet.kube.source import Gone, Source
from simulator.scheduling import DeviceKey

Obj = dict[str, Any]
ObjList = list[Obj]  # module-level alias: inside the class `list` is the method
Key = tuple[str, str]  # (namespace or "", name)

KINDS: tuple[str, ...] = (
    "ResourceSlice",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "DeviceClass",
    "Node",
    "Pod",
    "Event",
    "DeviceTaintRule",
)
API_VERSIONS: dict[str, str] = {
    "ResourceSlice": "resource.k8s.io/v1",
    "ResourceClaim": "resource.k8s.io/v1",
    "ResourceClaimTemplate": "resource.k8s.io/v1",
    "DeviceClass": "resource.k8s.io/v1",
    "Node": "v1",
    "Pod": "v1",
    "Event": "v1",
    "DeviceTaintRule": "resource.k8s.io/v1",
}


def expired_status(requested: str, oldest: int) -> Obj:
    """The Status object the API server sends in a watch ERROR event for a too-old resourceVersion."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {requested} ({oldest})",
        "reason": "Expired",
        "code": 410,
    }


def progress_bookmark(kind: str, resource_version: int) -> Obj:
    """A periodic BOOKMARK's object, as the API server's watch cache sends it: an empty object of the kind
    with only its resourceVersion set (the version the watch has got to; the client resumes from it)."""
    return {
        "kind": kind,
        "apiVersion": API_VERSIONS[kind],
        "metadata": {"resourceVersion": str(resource_version)},
    }


def object_key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


class SimulatedCluster:
    """In-memory object store with list/watch semantics (see module docstring).

    `history_limit` bounds the number of retained change events (across all kinds); a watch from a
    resourceVersion older than the oldest retained event gets 410.
    """

    def __init__(self, history_limit: int = 50_000, start_resource_version: int = 1000) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be >= 1")
        self._store: dict[str, dict[Key, Obj]] = {k: {} for k in KINDS}
        self._history: deque[tuple[int, str, str, Obj]] = deque()  # (rv, kind, type, object)
        self._history_limit = history_limit
        self._rv = start_resource_version
        # Every change with rv <= _compacted is gone from history.
        self._compacted = start_resource_version
        self._cond = threading.Condition()
        self._allocated: dict[DeviceKey, str] = {}
        self._slices_by_node: dict[str, ObjList] | None = None

    # ---- read side (Source protocol) -------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def list(self, kind: str) -> tuple[ObjList, str]:
        """Current objects of `kind` (sorted by namespace/name, like the API server) and the list RV."""
        self._check_kind(kind)
        with self._cond:
            store = self._store[kind]
            return [store[k] for k in sorted(store)], str(self._rv)

    def watch(
        self,
        kind: str,
        resource_version: str,
        timeout_seconds: float | None = None,
        bookmark_interval: float | None = None,
    ) -> Iterator[Obj]:
        """Changes of `kind` after `resource_version`.

        "" or "0" starts with synthetic ADDED events for every current object (API server semantics for
        rv=0). Without `timeout_seconds` the watch replays the backlog, sends a BOOKMARK and ends, so a
        single-threaded caller never blocks; with it, it keeps waiting for new changes (made by another
        thread) until the timeout, then ends with a BOOKMARK. A too-old version yields one ERROR (410) event.
        With `bookmark_interval` too, a BOOKMARK also comes every that many seconds while waiting, as the
        API server's watch cache sends one about every minute: it tells a client of a quiet kind that the
        stream is alive and how far it has got, so it neither reconnects for silence nor resumes from a
        version the history has dropped since.
        """
        self._check_kind(kind)
        if bookmark_interval is not None and not bookmark_interval > 0:  # also refuses NaN
            raise ValueError(f"bookmark_interval must be > 0, got {bookmark_interval!r}")
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        next_bookmark = None if bookmark_interval is None else time.monotonic() + bookmark_interval
        if resource_version in ("", "0"):
            items, rv = self.list(kind)
            for obj in items:
                yield {"type": "ADDED", "object": obj}
            last = int(rv)
        else:
            try:
                last = int(resource_version)
            except ValueError:
                yield {"type": "ERROR", "object": _bad_request(resource_version)}
                return
        while True:
            try:
                batch, last = self._events_after(kind, last)
            except Gone:
                yield {"type": "ERROR", "object": expired_status(resource_version, self._compacted + 1)}
                return
            yield from batch
            if deadline is None:
                break
            now = time.monotonic()
            if next_bookmark is not None and bookmark_interval is not None and now >= next_bookmark:
                yield {"type": "BOOKMARK", "object": progress_bookmark(kind, last)}
                next_bookmark = now + bookmark_interval
            remaining = deadline - now
            if remaining <= 0:
                break
            wait = remaining if next_bookmark is None else min(remaining, max(0.0, next_bookmark - now))
            with self._cond:
                if self._rv == last:
                    self._cond.wait(wait)
        yield {"type": "BOOKMARK", "object": self._bookmark(kind, last)}

    def _events_after(self, kind: str, rv: int) -> tuple[ObjList, int]:
        with self._cond:
            if rv < self._compacted:
                raise Gone
            out = [{"type": t, "object": o} for (erv, k, t, o) in self._history if erv > rv and k == kind]
            return out, max(rv, self._rv)

    def _bookmark(self, kind: str, rv: int) -> Obj:
        return {
            "kind": kind,
            "apiVersion": API_VERSIONS[kind],
            "metadata": {"resourceVersion": str(rv), "annotations": {"k8s.io/initial-events-end": "true"}},
        }

    # ---- ClusterState protocol (for schedulers) ----------------------------------------------------------

    def objects(self, kind: str) -> Iterable[Obj]:
        self._check_kind(kind)
        return list(self._store[kind].values())

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        self._check_kind(kind)
        return self._store[kind].get((namespace or "", name))

    def allocated_devices(self) -> Mapping[DeviceKey, str]:
        return dict(self._allocated)

    def slices_by_node(self) -> Mapping[str, ObjList]:
        """Slices of each node's pools, highest generation only (cached until a slice changes)."""
        if self._slices_by_node is None:
            best: dict[tuple[str, str], int] = {}
            for s in self._store["ResourceSlice"].values():
                pool = (s["spec"]["driver"], s["spec"]["pool"]["name"])
                best[pool] = max(best.get(pool, 0), int(s["spec"]["pool"]["generation"]))
            by_node: dict[str, ObjList] = {}
            for key in sorted(self._store["ResourceSlice"]):
                s = self._store["ResourceSlice"][key]
                pool = (s["spec"]["driver"], s["spec"]["pool"]["name"])
                if int(s["spec"]["pool"]["generation"]) == best[pool] and s["spec"].get("nodeName"):
                    by_node.setdefault(s["spec"]["nodeName"], []).append(s)
            self._slices_by_node = by_node
        return self._slices_by_node

    # ---- write side ----------------------------------------------------------------------------------------

    def create(self, obj: Obj) -> Obj:
        """Store a new object; error if it exists (409 in the real API)."""
        kind = obj["kind"]
        self._check_kind(kind)
        if object_key(obj) in self._store[kind]:
            raise KeyError(f"{kind} {object_key(obj)} already exists")
        return self._put(obj, "ADDED")

    def update(self, obj: Obj) -> Obj:
        """Replace an existing object (no optimistic-concurrency check: the simulator is the only writer)."""
        kind = obj["kind"]
        self._check_kind(kind)
        if object_key(obj) not in self._store[kind]:
            raise KeyError(f"{kind} {object_key(obj)} not found")
        return self._put(obj, "MODIFIED")

    def apply(self, obj: Obj) -> Obj:
        """Create or update."""
        exists = object_key(obj) in self._store[obj["kind"]]
        return self._put(obj, "MODIFIED" if exists else "ADDED")

    def delete(self, kind: str, namespace: str | None, name: str) -> Obj:
        """Remove an object; the DELETED event carries its last state with a new resourceVersion."""
        self._check_kind(kind)
        with self._cond:
            old = self._store[kind].pop((namespace or "", name))
            self._rv += 1
            gone = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self._rv)}}
            self._record(kind, "DELETED", gone)
            self._index(kind, old, None)
            self._cond.notify_all()
            return gone

    def bulk_create(self, objs: Iterable[Obj]) -> None:
        """Create many objects (e.g. a generated fleet)."""
        for o in objs:
            self.create(o)

    def _put(self, obj: Obj, event_type: str) -> Obj:
        kind = obj["kind"]
        with self._cond:
            self._rv += 1
            stored = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self._rv)}}
            old = self._store[kind].get(object_key(obj))
            self._store[kind][object_key(obj)] = stored
            self._record(kind, event_type, stored)
            self._index(kind, old, stored)
            self._cond.notify_all()
            return stored

    def _record(self, kind: str, event_type: str, obj: Obj) -> None:
        self._history.append((self._rv, kind, event_type, obj))
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft()[0]

    def compact(self, keep: int = 0) -> None:
        """Drop all but the newest `keep` history entries (simulates etcd compaction)."""
        with self._cond:
            while len(self._history) > keep:
                self._compacted = self._history.popleft()[0]
            if not self._history:
                self._compacted = self._rv

    def history(self) -> ObjList:
        """The retained change events (all kinds) in order, as watch events."""
        with self._cond:
            return [{"type": t, "object": o} for (_, _, t, o) in self._history]

    def _index(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Keep derived indexes (allocated devices, slices per node) in step with the store."""
        if kind == "ResourceSlice":
            self._slices_by_node = None
        if kind != "ResourceClaim":
            return
        for claim, add in ((old, False), (new, True)):
            if claim is None:
                continue
            ref = f"{claim['metadata'].get('namespace', '')}/{claim['metadata']['name']}"
            results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
            for r in results:
                if r.get("adminAccess"):
                    continue
                key = (r["driver"], r["pool"], r["device"])
                if add:
                    self._allocated[key] = ref
                elif self._allocated.get(key) == ref:
                    del self._allocated[key]

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unsupported kind {kind!r}; one of {KINDS}")


def _bad_request(rv: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'resourceVersion: Invalid value: "{rv}": strconv.ParseUint: parsing "{rv}": '
        "invalid syntax",
        "reason": "BadRequest",
        "code": 400,
    }


if TYPE_CHECKING:
    # mypy proves the simulator offers the reflector's protocol (one definition, in fleet.kube.source).
    def _is_a_source(cluster: SimulatedCluster) -> Source:
        return cluster
