"""The stored diagnoses of pending claims, kept up to date incrementally.

Every relevant fleet change (slices, classes, claims, pods, nodes) is appended to the cluster's change log
(``claims.changelog``) by ``on_fleet_change``, which then asks for ``update_diagnoses`` within
``UPDATE_WINDOW`` seconds (a Redis ``SET NX PX`` marker absorbs the calls in between, or an in-process one
when Redis is not configured). The tasks are routed to the "diagnosis" queue, whose one worker process keeps
the lean fleet of each cluster in memory (``claims.livestate``): an update applies the logged events to it,
diagnoses again only the pending claims the events reached (their own object or pods, the device groups of
their classes in the pools that changed, or everything when a class, a node or a pool problem changed, or
on a relist too large to name its keys), writes the diagnoses that differ from the stored ones and tells
open pending pages (``/ws/pending/``).

``recompute_diagnoses`` is the full recompute: it reloads the fleet and diagnoses every pending claim. It
runs when a process has no fleet yet (a restart) or lost events, after an import, and periodically as a
check (``check_diagnoses``, beat, every ``CLAIMSCOPE_DIAGNOSIS_CHECK_SECONDS``), logging any diagnosis the
incremental path held differently. Both take a cluster name, are idempotent, and run once per cluster at a
time.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import uuid4

import orjson
from celery import shared_task
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import DateTimeField, Expression, JSONField, QuerySet, Value
from django.utils import timezone

from claims import changelog, history
from claims.causes import Pending, cause_of
from claims.consumers import notify_pending_changed
from claims.diagnosis import diagnose, prepare
from claims.diagnosis.footprint import Footprint
from claims.diagnosis.placement import pod_as_read
from claims.fleetstate import FleetState
from claims.livestate import LiveFleet, Reach, affected
from claims.models import ClaimDiagnosis, DiagnosisShape, PendingCause
from claims.shaped import PLACEHOLDERS, SHAPE_NAME, SHAPE_POD, SHAPE_UID, put_names
from fleet.gcpause import cyclic_gc_paused
from fleet.models import Cluster, ResourceClaim

log = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 5  # a full recompute asked for again while one runs follows it after this long
UPDATE_WINDOW = 0.5  # seconds: changes inside this window are applied by one update
RELEVANT_KINDS = frozenset(
    {"ResourceSlice", "DeviceClass", "ResourceClaim", "Pod", "Node", "DeviceTaintRule"}
)
CAUSE_REFRESH = timedelta(seconds=60)  # an unchanged cause's last_seen, summary and result lag at most this
FREEZE_ABOVE = 50_000  # objects of a live fleet above which it is frozen out of the collector's sight
PREPARE_ABOVE = 20  # diagnoses of one state above which the fleet's indexes are built up front
_local_marks: dict[str, float] = {}
_T = TypeVar("_T")
DEADLOCK_SQLSTATE = "40P01"  # PostgreSQL's deadlock_detected


def _marker(cluster: str) -> str:
    return f"claimscope:diagnoses:pending:{cluster}"


def _claim_window(cluster: str) -> bool:
    """True if this call opens a new window (and so must enqueue the update)."""
    url = getattr(settings, "REDIS_URL", None)
    if url:
        import redis

        try:
            client = changelog.redis_client(url)
            return bool(client.set(_marker(cluster), "1", nx=True, px=int(UPDATE_WINDOW * 1000)))
        except redis.RedisError:
            log.warning("redis unavailable; diagnoses of %s updated without a window", cluster)
            return True
    now = time.monotonic()
    if now - _local_marks.get(cluster, -UPDATE_WINDOW) < UPDATE_WINDOW:
        return False
    _local_marks[cluster] = now
    return True


def request_update(cluster: str, kind: str = "") -> bool:
    """Ask for the diagnoses of ``cluster`` to be updated soon; returns True if a task was enqueued."""
    if kind and kind not in RELEVANT_KINDS:
        return False
    if not _claim_window(cluster):
        return False
    transaction.on_commit(lambda: update_diagnoses.apply_async(args=[cluster], countdown=UPDATE_WINDOW))
    return True


def on_fleet_change(event: dict[str, Any]) -> bool:
    """Hook for ingest's ``fleet.change`` events (``{"cluster", "kind", ...}``), called after commit: the
    event goes to the cluster's change log and an update is asked for. A finished import (``"imported"``)
    is logged too (the update then reloads everything) and updates at once: its first batch may have
    opened a window whose task (run at once where tasks run in-process) saw none of the later batches."""
    cluster = str(event.get("cluster", ""))
    kind = str(event.get("kind", ""))
    if not event.get("imported") and kind not in RELEVANT_KINDS:
        return False
    changelog.append(cluster, event)
    if event.get("imported"):
        transaction.on_commit(lambda: update_diagnoses.apply_async(args=[cluster]))
        return True
    return request_update(cluster, kind)


def diagnosis_of(state: FleetState, claim: ResourceClaim) -> dict[str, Any]:
    """The diagnosis of one stored claim on ``state``, as stored (``ClaimDiagnosis.result``)."""
    return diagnose(state, {**claim.raw, "kind": "ResourceClaim"}).as_dict()


_PLACEHOLDERS = tuple(p.encode() for p in PLACEHOLDERS)


@dataclass(frozen=True)
class Diagnosed:
    """A claim's diagnosis as stored: its shape's key and diagnosis (JSON text, with the placeholders of
    ``claims.shaped`` when ``named``), and the names the claim reads it with."""

    key: str
    text: str
    named: bool
    name: str = ""
    uid: str = ""
    pod_name: str = ""

    def own(self, text: str) -> str:
        """``text`` (the shape's diagnosis or summary) as this claim reads it."""
        return put_names(text, self.name, self.uid, self.pod_name, named=self.named)


class Shapes:
    """Diagnoses of the claims of one state, shared between claims of the same shape.

    Pending claims come in few shapes (a job's claims are alike, thousands at a time, and so are their
    pods). The shape is what a claim's diagnosis reads: the claim but for its metadata, of which only its
    namespace and whether it has a uid, and of its first pod what ``pod_as_read`` keeps, but for the pod's
    name. The shape is diagnosed once, on a claim and a pod made of exactly that, so the diagnosis cannot
    read what the shape leaves out. Sharing is checked by the random-stream test, which diagnoses every
    claim alone on a state of its own."""

    def __init__(self, state: FleetState) -> None:
        self.state = state
        self.done: dict[str, str] = {}
        self.failed: dict[str, str] = {}  # shapes whose diagnosis raised: the error
        self.diagnosed = 0

    def _diagnose(self, raw: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> str:
        # A few shapes read a few device groups, lazily; past PREPARE_ABOVE diagnoses the per-fleet
        # indexes are built at once (claims.diagnosis.prepare), as the full recompute does. Counted
        # after: should it raise, the next diagnosis tries again.
        if self.diagnosed + 1 == PREPARE_ABOVE:
            prepare(self.state)
        self.diagnosed += 1
        return json.dumps(diagnose(self.state, raw, pods=pods).as_dict())

    def of(self, claim: ResourceClaim) -> dict[str, Any]:
        return dict(json.loads(self.text_of(claim)))

    def text_of(self, claim: ResourceClaim) -> str:
        """The diagnosis of ``claim`` as JSON text (what ``of`` decodes)."""
        d = self.diagnosed_as(claim)
        return d.own(d.text)

    def diagnosed_as(self, claim: ResourceClaim) -> Diagnosed:
        """The diagnosis of ``claim`` as stored: its shape's, or its own when diagnosed alone (a claim
        without a name, or whose names hold a placeholder)."""
        raw = {**claim.raw, "kind": "ResourceClaim"}
        meta = raw.get("metadata") or {}
        name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
        alone = f"claim-{claim.pk}"
        if not name:
            return Diagnosed(alone, self._diagnose(raw), named=False)
        pods = self.state.pods_of_claim(raw)
        pod = pod_as_read(pods[0]) if pods else None
        pod_name = str(pod["metadata"]["name"]) if pod else ""
        read = {"namespace": meta["namespace"]} if "namespace" in meta else {}
        pod_shape = {**pod, "metadata": {**pod["metadata"], "name": bool(pod_name)}} if pod else None
        shape = orjson.dumps(
            [{**raw, "metadata": {**read, "uid": bool(uid)}}, pod_shape], option=orjson.OPT_SORT_KEYS
        )
        named = f"{name}\n{uid}\n{pod_name}".encode()
        if any(p in shape or p in named for p in _PLACEHOLDERS):
            return Diagnosed(alone, self._diagnose(raw), named=False)
        key = hashlib.blake2b(shape, digest_size=16).hexdigest()
        text = self.done.get(key)
        if text is None:
            if key in self.failed:
                raise ShapeFailed(self.failed[key])
            canonical = {
                **raw,
                "metadata": {**read, "name": SHAPE_NAME, **({"uid": SHAPE_UID} if uid else {})},
            }
            as_pods = [{**pod, "metadata": {**pod["metadata"], "name": SHAPE_POD}}] if pod else []
            try:
                text = self.done[key] = self._diagnose(canonical, as_pods)
            except Exception as exc:
                self.failed[key] = f"{type(exc).__name__}: {exc}"
                raise
        return Diagnosed(key, text, named=True, name=name, uid=uid, pod_name=pod_name)


class ShapeFailed(Exception):
    """The diagnosis of a claim of the same shape raised earlier (logged then with its traceback)."""


class DiagnosisFailed(Exception):
    """Every claim's diagnosis raised: the fault is the fleet's or the engine's, not one claim's."""


def _texts(
    cluster: str, shapes: Shapes, claims: Iterable[ResourceClaim]
) -> tuple[list[tuple[ResourceClaim, Diagnosed]], list[ResourceClaim]]:
    """(claim, diagnosis) of each of ``claims``, and the claims whose diagnosis raised, each logged by
    name (the caller drops their stored diagnoses: the others are of this fleet state). One claim the
    engine cannot diagnose must not keep every other claim of the cluster from its diagnosis, nor turn
    each update into a recompute that fails too. Raises DiagnosisFailed when two or more claims were
    diagnosed and all failed."""
    texts: list[tuple[ResourceClaim, Diagnosed]] = []
    failed: list[ResourceClaim] = []
    for claim in claims:
        try:
            texts.append((claim, shapes.diagnosed_as(claim)))
        except ShapeFailed as exc:
            failed.append(claim)
            log.error(
                "diagnosis of claim %s/%s in cluster %s failed as for an earlier claim of its shape: %s",
                claim.namespace,
                claim.name,
                cluster,
                exc,
            )
        except Exception:
            failed.append(claim)
            log.exception(
                "diagnosis of claim %s/%s in cluster %s failed", claim.namespace, claim.name, cluster
            )
    if len(failed) > 1 and not texts:
        raise DiagnosisFailed(f"the diagnoses of all {len(failed)} claims of cluster {cluster} failed")
    return texts, failed


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def cause_key(cluster: str, claim: ResourceClaim, result: dict[str, Any]) -> str:
    """The cause group of a claim's diagnosis (``claims.causes.cause_of``), as stored with its shape."""
    # The cause does not depend on the claim's age: any time will do for one without a creation time.
    return cause_of(Pending(cluster, claim.namespace, claim.name, claim.created_at or _EPOCH, result)).key


class JSONText(Expression):
    """A JSON document given as its text, for a JSON column: written as it is. Django would encode the
    decoded result again (json.dumps, then quoted); that and the stdlib's decoding took 0.05-0.07 s per
    ~1,000 results of 5 KB (measured when each claim's result had a row: causes still do)."""

    output_field = JSONField()

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[str]]:
        return "%s", (self.text,)  # SQLite keeps JSON as text

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, tuple[str]]:
        return "%s::jsonb", (self.text,)


def _decoded(text: str) -> Any:
    """A stored result's text decoded: orjson (3x the stdlib's speed), the stdlib for what orjson refuses
    (integers beyond 64 bits)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _literal_time(at: datetime) -> Value:
    """``at`` as an expression, for bulk writes of large JSON. An expression makes Django's bulk insert
    on PostgreSQL use VALUES rather than UNNEST of one array per column: the arrays of results (~5 KB of
    JSON each) are quoted element by element in Python (psycopg's client-side array dumper, 2 s for 1,000
    diagnoses and their causes), while VALUES parameters are escaped by libpq."""
    return Value(at, output_field=DateTimeField())


@dataclass(frozen=True)
class ShapeSaid:
    """What a stored shape says, besides its result: what causes are recorded with."""

    category: str
    summary: str
    group_key: str


# claim id -> (category, cause group, when recorded) of the cause last recorded for the claim
Recorded = dict[int, tuple[str, str, datetime]]


def record_causes(
    diagnosed: list[tuple[ResourceClaim, Diagnosed]],
    said: dict[str, ShapeSaid],
    now: datetime,
    recorded: Recorded | None = None,
) -> Recorded:
    """Keep each pending claim's cause (one row per claim and cause group, first and last seen), so the
    triage can report the causes of claims no longer pending. One bulk statement. Returns what it wrote.
    The cause is the one stored with each claim's shape (``said``, by shape key).

    With ``recorded`` (what was written before), a claim whose cause is the one recorded less than
    ``CAUSE_REFRESH`` ago is left alone: under churn nearly every update changes the counts of thousands of
    diagnoses without changing their cause, and rewriting their cause rows (5 KB of result each) was a
    third of an update. A new cause is recorded at once; without ``recorded`` every cause is."""
    stamp = _literal_time(now)
    rows = []
    fresh: Recorded = {}
    for claim, d in diagnosed:
        shape = said[d.key]
        last = (recorded or {}).get(claim.pk)
        if (
            last is not None
            and last[:2] == (shape.category, shape.group_key)
            and now - last[2] < CAUSE_REFRESH
        ):
            continue
        fresh[claim.pk] = (shape.category, shape.group_key, now)
        rows.append(
            PendingCause(
                cluster_id=claim.cluster_id,
                uid=claim.uid,
                namespace=claim.namespace,
                name=claim.name,
                category=shape.category,
                group_key=shape.group_key,
                summary=d.own(shape.summary),
                result=JSONText(d.own(d.text)),
                first_seen=stamp,
                last_seen=stamp,
            )
        )
    PendingCause.objects.bulk_create(
        rows,
        batch_size=STORE_CHUNK,
        update_conflicts=True,
        unique_fields=["cluster", "uid", "category", "group_key"],
        update_fields=["summary", "result", "last_seen"],  # first_seen stays that of the first diagnosis
    )
    return fresh


RUN_TTL = 3600  # seconds: a recompute holding its cluster's lock longer than this is presumed dead
# Delete the key only if it still holds our token (another run may own it after our TTL ran out).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


@contextmanager
def _single_flight(cluster: str) -> Iterator[bool]:
    """One recompute per cluster at a time (on a large fleet one takes minutes, and changes keep coming).

    Yields True when this run holds the cluster's lock; False when another run holds it: then a rerun is
    flagged, and the running one enqueues one more recompute when it ends, so no change goes unseen.
    Without Redis (the demo, tasks run in-process) every run proceeds."""
    url = getattr(settings, "REDIS_URL", None)
    if not url:
        yield True
        return
    import redis

    client = changelog.redis_client(url)
    key, rerun, token = (
        f"claimscope:diagnoses:running:{cluster}",
        f"claimscope:diagnoses:rerun:{cluster}",
        uuid4().hex,
    )
    try:
        acquired = bool(client.set(key, token, nx=True, ex=RUN_TTL))
        if not acquired:
            client.set(rerun, "1", ex=RUN_TTL)
    except redis.RedisError:
        log.warning("redis unavailable; diagnoses of %s recomputed without the single-run lock", cluster)
        yield True
        return
    if not acquired:
        log.info("recompute_diagnoses: %s is being recomputed; one more run will follow it", cluster)
        yield False
        return
    try:
        yield True
    finally:
        try:
            client.eval(_RELEASE, 1, key, token)
            if client.delete(rerun):
                update_diagnoses.apply_async(args=[cluster])
        except redis.RedisError:
            log.warning("redis unavailable; the lock of %s expires by itself", cluster)


@dataclass
class _Live:
    """A process's fleet of one cluster: its objects, its log position, and the footprint of its state
    at the last update (the state itself is released once its claims are diagnosed)."""

    fleet: LiveFleet
    position: changelog.Position
    footprint: Footprint | None = None  # None until the first diagnosis of the fleet is stored
    # Digest of the diagnosis text this process stored per shape (by key). The process is the one writer
    # of the diagnoses, so an update compares digests instead of reading the stored results back.
    shapes: dict[str, bytes] = field(default_factory=dict)
    causes: Recorded = field(default_factory=dict)  # see record_causes
    claims: dict[int, ResourceClaim] = field(default_factory=dict)  # see _pending_rows


_live: dict[str, _Live] = {}  # by cluster, per worker process
_held: dict[str, threading.RLock] = {}  # by cluster: one thread of the process at a time changes its fleet
_held_guard = threading.Lock()


@contextmanager
def _in_process(cluster: str) -> Iterator[None]:
    """Without Redis, hold ``cluster``'s fleet for this thread. With Redis the lock of
    ``_single_flight`` keeps two runs of a cluster apart, threads included (and a run that finds it held
    returns at once rather than keep a worker thread waiting). Without it (the demo runs tasks in each
    ingest thread) this keeps two threads from changing one fleet's lists and kept rows at once.
    Re-entrant: a run that ends by enqueueing the next one runs it at once where tasks run in-process."""
    if getattr(settings, "REDIS_URL", None):
        yield
        return
    with _held_guard:
        lock = _held.setdefault(cluster, threading.RLock())
    with lock:
        yield


def forget(cluster: str | None = None) -> None:
    """Drop this process's fleet of ``cluster`` (of every cluster when None): the next update reloads."""
    for name in [cluster] if cluster else list(_live):
        _live.pop(name, None)


@shared_task(bind=True, ignore_result=True)
def update_diagnoses(self: Any, cluster: str, now: str | None = None) -> dict[str, int]:
    """Apply the logged fleet changes of ``cluster`` to this process's fleet and store the diagnoses they
    changed; a full recompute when this process has no fleet of ``cluster`` or lost events. Returns
    counts ("diagnosed", "written", "removed", "full")."""
    # The update's allocations (a state, its indexes, the diagnoses) trigger collections that walk every
    # object made since the fleet was frozen, over and over (0.6 s of a 2.1 s update at L); what it
    # leaves is trees and released states, and the collector resumes afterwards.
    with cyclic_gc_paused(), _in_process(cluster):
        if self.request.called_directly:
            return _update(cluster, now)
        with _single_flight(cluster) as mine:
            return _update(cluster, now) if mine else {}


@shared_task(bind=True, ignore_result=True)
def recompute_diagnoses(self: Any, cluster: str, now: str | None = None) -> dict[str, int]:
    """Reload the fleet of ``cluster`` and diagnose every pending claim; returns counts per category.
    ``now`` (ISO 8601, default the current time) stamps the results: a replay of a simulated weekend
    passes its simulated time. As a Celery task it runs once per cluster at a time
    (:func:`_single_flight`); called as a function (tests, replays) it just runs."""
    with _in_process(cluster):
        if self.request.called_directly:
            return _recompute(cluster, now)
        with _single_flight(cluster) as mine:
            return _recompute(cluster, now) if mine else {}


@shared_task(ignore_result=True)
def check_diagnoses() -> int:
    """Beat: a full recompute of every cluster, the check of the incremental path."""
    names = list(Cluster.objects.values_list("name", flat=True))
    for name in names:
        recompute_diagnoses.delay(name)
    return len(names)


def _at(now: str | None) -> datetime:
    return datetime.fromisoformat(now) if now else timezone.now()


def _recompute(cluster: str, now: str | None) -> dict[str, int]:
    at = _at(now)
    forget(cluster)
    # Before the load: what follows it is applied (twice is harmless), unless the load read its kind after
    # it was logged (LiveFleet.read_at).
    position = changelog.position(cluster)
    # Loading and indexing create ~10^7 long-lived objects: the collector would walk them over and over.
    with cyclic_gc_paused():
        try:
            fleet = LiveFleet.load(cluster, mark=lambda: changelog.position(cluster).number)
        except LookupError:
            log.warning("recompute_diagnoses: unknown cluster %s", cluster)
            return {}
        state = fleet.state()
        state.devices()
        live = _live[cluster] = _Live(fleet, position)
        if fleet.size() > FREEZE_ABOVE:
            # The fleet lives until the next recompute: out of the collector's sight (gc.freeze), full
            # collections during updates walk what the updates made, not the fleet (1.2 s each at L). What
            # an earlier freeze kept is given back first, and one collection frees the cycles left meanwhile,
            # so nothing stays frozen for good; the fleet itself is trees, freed by reference counting when
            # it is replaced. Small fleets (the demo, tests) skip this: a full collection costs more than it
            # saves there.
            gc.unfreeze()
            gc.collect()
            gc.freeze()
    with state:
        counts = _diagnose_pending(cluster, state, at, live)
        live.footprint = Footprint.of(state)
    return counts


def _update(cluster: str, now: str | None) -> dict[str, int]:
    live = _live.get(cluster)
    if live is not None and not Cluster.objects.filter(name=cluster, pk=live.fleet.cluster_id).exists():
        forget(cluster)  # the cluster was dropped (and maybe added again): its fleet is another one
        live = None
    # A recompute loads the fleet again: this frame must not hold the one it replaces meanwhile (two
    # fleets at once, +1.4 GB at XL).
    before = live.footprint if live is not None else None
    if live is None or before is None:
        live = None
        return {**_recompute(cluster, now), "full": 1}
    try:
        events, position = changelog.read(cluster, live.position)
    except changelog.Gap:
        log.warning("update_diagnoses: change events of %s were dropped; recomputing all", cluster)
        live = None
        return {**_recompute(cluster, now), "full": 1}
    try:
        reach = live.fleet.apply(events)
        live.position = position
        if not reach:
            return {"diagnosed": 0, "written": 0, "removed": 0}
        with live.fleet.state() as state:
            counts = _diagnose_changed(cluster, live, before, state, reach, _at(now))
    except BaseException:
        # Events applied (some or all) but the claims they reached maybe not stored: with no footprint,
        # the next update recomputes every claim instead of trusting what this one left.
        live.footprint = None
        raise
    if live.fleet.size() > FREEZE_ABOVE:
        # What the update leaves alive (the changed objects, the footprint) joins the frozen fleet. Left to
        # the collector, the first allocation after the pause walks all of it as one young generation: 15%
        # of an update under churn (profile of bench_e2e, L). What is freed later goes by reference
        # counting as before; cycles wait for the next recompute's unfreeze and collection.
        gc.freeze()
    return counts


def _diagnose_changed(
    cluster: str, live: _Live, before: Footprint, state: FleetState, reach: Reach, at: datetime
) -> dict[str, int]:
    """Diagnose the pending claims ``reach`` may have changed between ``before`` and ``state``, the fleet
    now; the live fleet keeps the footprint of ``state``."""
    pending = dict(
        ((ns, name), pk)
        for pk, ns, name in ResourceClaim.objects.filter(cluster_id=live.fleet.cluster_id, state="pending")
        .values_list("id", "namespace", "name")
        .iterator()
    )
    claims = live.fleet.objects["ResourceClaim"]
    objs = {k: claims.get(k) or {} for k in pending}
    after = live.footprint = Footprint.of(state)
    keys = affected(before, after, reach, objs)
    chosen = set(pending) if keys is None else keys & set(pending)
    still = set(pending.values())
    for kept in (live.causes, live.claims):
        for gone in [pk for pk in kept if pk not in still]:
            del kept[gone]
    return _diagnose_some(cluster, state, [pending[k] for k in chosen], at, live, still)


def _diagnose_some(
    cluster: str, state: FleetState, ids: list[int], at: datetime, live: _Live, pending: set[int]
) -> dict[str, int]:
    """Diagnose the pending claims ``ids``; store the diagnoses that differ from the stored ones, and
    drop the diagnoses of claims not among ``pending`` (the ids of the cluster's pending claims, as this
    update read them). The live fleet's digests and causes are kept up to date once the transaction
    commits."""
    rows = _pending_rows(live.claims, ids)
    diagnosed, failed = _texts(cluster, Shapes(state), rows)

    def write() -> tuple[_Stored, int]:
        done = _store_texts(cluster, live.fleet.cluster_id, diagnosed, at, live.causes, live.shapes)
        removed = _drop_not_pending(live.fleet.cluster_id, pending)
        removed += _drop_failed(failed)
        _drop_unused_shapes(live.fleet.cluster_id, done)
        _remember_on_commit(live, done, replace=False)
        if done.written or removed:
            transaction.on_commit(lambda: notify_pending_changed(cluster))
        return done, removed

    done, removed = _committed(cluster, write)
    counts = {"diagnosed": len(rows), "written": done.written, "removed": removed}
    return {**counts, "failed": len(failed)} if failed else counts


# What the diagnosis task reads of a claim's row (Shapes, record_causes, cause_key); the other JSON
# columns are derived from ``raw`` and would only be decoded.
_READ = ("id", "cluster_id", "uid", "namespace", "name", "created_at", "resource_version", "raw")


def _read(claims: QuerySet[ResourceClaim]) -> QuerySet[ResourceClaim]:
    return claims.filter(state="pending").only(*_READ)


def _pending_rows(kept: dict[int, ResourceClaim], ids: list[int]) -> list[ResourceClaim]:
    """The claims ``ids`` that are pending, by id, as stored now. ``kept`` holds the rows this process
    read before: one still at the same resourceVersion is taken from it rather than read and decoded again
    (its raw JSON and three more JSON columns: ~2,000 claims at L on every update under churn, of which a
    few changed). Ingest writes a row only with a new resourceVersion."""
    if not ids:
        return []
    versions = dict(
        ResourceClaim.objects.filter(id__in=ids, state="pending").values_list("id", "resource_version")
    )
    stale = [pk for pk, version in versions.items() if pk not in kept or kept[pk].resource_version != version]
    for pk in stale:
        kept.pop(pk, None)
    for start in range(0, len(stale), STORE_CHUNK):
        for claim in _read(ResourceClaim.objects.filter(id__in=stale[start : start + STORE_CHUNK])):
            kept[claim.pk] = claim
    return [kept[pk] for pk in sorted(versions) if pk in kept]


DEADLOCK_TRIES = 3
DEADLOCK_PAUSE = 0.05  # seconds, times the try: the pause before writing again


def _committed(cluster: str, write: Callable[[], _T]) -> _T:
    """``write()`` in one transaction, run again when PostgreSQL broke a deadlock by aborting it.

    The foreign-key checks of new diagnosis rows lock their claims (KEY SHARE) at commit, in the rows'
    order. The watch worker's upsert of a claim recreated under its name sets its uid, a key, and so
    locks it exclusively, in its batch's order: the two can deadlock (plain updates leave the uid out and
    do not wait for these locks, ``fleet.ingest.rows.upsert``). The diagnoses are still those of the state,
    so the writes are tried again rather than dropped for a full recompute. Inside a caller's transaction
    (tests) a deadlock is the caller's to handle."""
    for attempt in range(1, DEADLOCK_TRIES + 1):
        try:
            with transaction.atomic():
                return write()
        except OperationalError as exc:
            deadlock = getattr(exc.__cause__, "sqlstate", None) == DEADLOCK_SQLSTATE
            if not deadlock or attempt == DEADLOCK_TRIES or connection.in_atomic_block:
                raise
            log.warning(
                "diagnoses of %s: a deadlock aborted the write (try %d); writing again", cluster, attempt
            )
            # A moment of random length first, so that the other transaction (a watch batch) likely
            # commits before the write takes its locks again.
            _pause(random.uniform(0.5, 1.5) * DEADLOCK_PAUSE * attempt)
    raise AssertionError("unreachable")  # the loop returns or raises


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _drop_failed(failed: list[ResourceClaim]) -> int:
    """Drop the stored diagnoses of claims whose diagnosis failed (they show as not diagnosed yet, not as
    diagnosed on an older fleet); returns how many there were."""
    if not failed:
        return 0
    dropped, _ = ClaimDiagnosis.objects.filter(claim_id__in=[c.pk for c in failed]).delete()
    return dropped


def _drop_not_pending(cluster_id: int, pending: set[int]) -> int:
    """Delete the stored diagnoses of the cluster's claims that are not in ``pending``; returns how many.
    The cluster's diagnoses are found through its shapes (a few, indexed) and compared here: a join of
    the diagnoses with the claims' states walked the cluster's claims by id, and under churn was a third
    of an update's waits on PostgreSQL (bench_e2e, L)."""
    gone = [
        pk
        for pk, claim_id in ClaimDiagnosis.objects.filter(shape__cluster_id=cluster_id).values_list(
            "id", "claim_id"
        )
        if claim_id not in pending
    ]
    gone.sort()  # by id: two such deletes lock the rows they share in one order
    removed = 0
    for start in range(0, len(gone), STORE_CHUNK):
        removed += ClaimDiagnosis.objects.filter(id__in=gone[start : start + STORE_CHUNK]).delete()[0]
    return removed


def _drop_unused_shapes(cluster_id: int, done: _Stored) -> None:
    """Delete the cluster's shapes no claim reads any more (their claims were allocated, deleted, or
    changed shape); ``done.dropped`` gets their keys."""
    unused = dict(
        DiagnosisShape.objects.filter(cluster_id=cluster_id, claimdiagnosis__isnull=True).values_list(
            "id", "key"
        )
    )
    if unused:
        DiagnosisShape.objects.filter(id__in=list(unused)).delete()
        done.dropped.extend(unused.values())


STORE_CHUNK = 500  # rows per statement: causes (a claim's result each), shapes, claims' links


@dataclass
class _Stored:
    written: int = 0  # claims whose stored diagnosis changed
    recorded: Recorded = field(default_factory=dict)  # see record_causes
    drifted: int = 0  # claims whose stored diagnosis differed (full recompute)
    categories: dict[str, int] = field(default_factory=dict)  # diagnoses stored per category
    shapes: dict[str, bytes] = field(default_factory=dict)  # digests of the shapes written, by key
    dropped: list[str] = field(default_factory=list)  # keys of the shapes deleted


def _store_texts(
    cluster: str,
    cluster_id: int,
    diagnosed: list[tuple[ResourceClaim, Diagnosed]],
    at: datetime,
    causes: Recorded | None,
    held: dict[str, bytes] | None,
) -> _Stored:
    """Store ``diagnosed`` in the caller's transaction: the shapes whose text is not the one ``held``
    (digests of what this process wrote), each claim's link to its shape where it changed, and the causes
    of the claims whose diagnosis changed (see record_causes). With ``held`` None (a full recompute) every
    shape is written, every cause recorded, and the claims whose stored diagnosis differed are counted.

    Claims of one shape share one row: under churn an L update changes ~1,800 claims' diagnoses (their
    free and held counts) but only ~7 shapes, and writing 1,800 results of 5 KB was a third of it."""
    out = _Stored()
    first: dict[str, tuple[ResourceClaim, Diagnosed]] = {}
    for claim, d in diagnosed:
        first.setdefault(d.key, (claim, d))
    present = dict(
        DiagnosisShape.objects.filter(cluster_id=cluster_id, key__in=list(first)).values_list("key", "id")
    )
    digests = {key: _digest(d.text) for key, (_, d) in first.items()}
    changed = [k for k in first if held is None or k not in present or held.get(k) != digests[k]]
    results = {k: _decoded(first[k][1].text) for k in changed}
    if held is None and changed:
        old = dict(
            DiagnosisShape.objects.filter(cluster_id=cluster_id, key__in=changed).values_list("key", "result")
        )
        stale = {k for k in changed if k in old and old[k] != results[k]}
    else:
        stale = set()
    stamp = _literal_time(at)
    DiagnosisShape.objects.bulk_create(
        [
            DiagnosisShape(
                cluster_id=cluster_id,
                key=k,
                named=first[k][1].named,
                category=results[k]["category"],
                summary=results[k]["summary"],
                result=JSONText(first[k][1].text),
                group_key=cause_key(cluster, first[k][0], results[k]),
                computed_at=stamp,
            )
            for k in changed
        ],
        batch_size=STORE_CHUNK,
        update_conflicts=True,
        unique_fields=["cluster", "key"],
        update_fields=["named", "category", "summary", "result", "group_key", "computed_at"],
    )
    out.shapes = {k: digests[k] for k in changed}
    ids: dict[str, int] = {}
    said: dict[str, ShapeSaid] = {}
    for key, pk, category, summary, group_key in DiagnosisShape.objects.filter(
        cluster_id=cluster_id, key__in=list(first)
    ).values_list("key", "id", "category", "summary", "group_key"):
        ids[key], said[key] = pk, ShapeSaid(category, summary, group_key)
    links = {
        claim_id: (shape_id, pod_name)
        for claim_id, shape_id, pod_name in ClaimDiagnosis.objects.filter(
            claim_id__in=[c.pk for c, _ in diagnosed]
        ).values_list("claim_id", "shape_id", "pod_name")
    }
    relink: list[ClaimDiagnosis] = []
    touched: list[tuple[ResourceClaim, Diagnosed]] = []
    changed_keys = set(changed)
    for claim, d in diagnosed:
        category = said[d.key].category
        out.categories[category] = out.categories.get(category, 0) + 1
        want = (ids[d.key], d.pod_name)
        had = links.get(claim.pk)
        if had != want:
            relink.append(ClaimDiagnosis(claim_id=claim.pk, shape_id=want[0], pod_name=want[1]))
        if had != want or d.key in changed_keys:
            touched.append((claim, d))
        if had is not None and (had != want or d.key in stale):
            out.drifted += 1
    ClaimDiagnosis.objects.bulk_create(
        relink,
        batch_size=STORE_CHUNK,
        update_conflicts=True,
        unique_fields=["claim"],
        update_fields=["shape", "pod_name"],
    )
    # A shape that gains a claim without changing was computed on this state too: its time says so, or a
    # new claim would show a diagnosis older than itself.
    gained = {d.key for claim, d in diagnosed if links.get(claim.pk) is None} - changed_keys
    if gained:
        DiagnosisShape.objects.filter(cluster_id=cluster_id, key__in=list(gained)).update(computed_at=stamp)
    out.written = len(touched)
    recording = touched if held is not None else diagnosed
    for start in range(0, len(recording), STORE_CHUNK):
        part = recording[start : start + STORE_CHUNK]
        out.recorded.update(record_causes(part, said, at, causes if held is not None else None))
    return out


def _remember_on_commit(live: _Live, done: _Stored, replace: bool) -> None:
    """After commit: what the live fleet knows it stored (a full recompute replaces it all). The callback
    holds the dicts only, not the fleet (a test's transaction keeps it)."""
    shapes, causes = live.shapes, live.causes

    def remember() -> None:
        if replace:
            shapes.clear()
            causes.clear()
        shapes.update(done.shapes)
        for key in done.dropped:
            shapes.pop(key, None)
        causes.update(done.recorded)

    transaction.on_commit(remember)


def _diagnose_pending(cluster: str, state: FleetState, at: datetime, live: _Live) -> dict[str, int]:
    pending = list(_read(ResourceClaim.objects.filter(cluster__name=cluster)).order_by("id"))
    live.claims.update((claim.pk, claim) for claim in pending)
    if pending:
        prepare(state)
    diagnosed, failed = _texts(cluster, Shapes(state), pending)

    # One transaction: a page never shows half old, half new diagnoses of one fleet state.
    def write() -> _Stored:
        done = _store_texts(cluster, live.fleet.cluster_id, diagnosed, at, None, None)  # every cause
        _drop_not_pending(live.fleet.cluster_id, {claim.pk for claim in pending})
        _drop_failed(failed)
        _drop_unused_shapes(live.fleet.cluster_id, done)
        _remember_on_commit(live, done, replace=True)
        # Open pending pages refetch their rows (claims.consumers); after commit, like every side effect.
        transaction.on_commit(lambda: notify_pending_changed(cluster))
        return done

    done = _committed(cluster, write)
    if done.drifted:
        # The incremental path (or a change it has not applied yet) held these differently.
        log.warning("recompute_diagnoses: %d stored diagnoses of %s were out of date", done.drifted, cluster)
    return {**done.categories, "failed": len(failed)} if failed else done.categories


@shared_task(ignore_result=True)
def prune_claim_history(now: str | None = None) -> dict[str, int]:
    """Daily: drop claim history and kept pending causes older than ``CLAIMSCOPE_CLAIM_HISTORY_DAYS``."""
    at = datetime.fromisoformat(now) if now else timezone.now()
    before = at - timedelta(days=settings.CLAIMSCOPE_CLAIM_HISTORY_DAYS)
    changes, lives = history.prune(before)
    causes, _ = PendingCause.objects.filter(last_seen__lt=before).delete()
    return {"changes": changes, "lifecycles": lives, "causes": causes}
