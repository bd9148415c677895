"""Claim history: every state change of every claim, recorded as fleet.ingest observes it.

``fleet.ingest`` calls :func:`record_written` and :func:`record_deleted` (hooked on the ResourceClaim
``TableSpec`` with ``fleet.ingest.set_claim_hooks`` when the claims app loads) inside the transaction of
each batch, so the history always agrees with the mirrored claim table. Each call costs a constant number
of bulk statements (one read of the batch's ``ClaimLifecycle`` rows, one upsert of the changed ones, one
insert of the ``ClaimStateChange`` rows), because a 40k-claim relist goes through it; a relist that changes
nothing writes nothing.

Times: Kubernetes' own where the object carries one (creationTimestamp for a claim first seen pending,
status.allocation.allocationTimestamp, deletionTimestamp), else the batch's observation time. A recorded time
never goes back before the claim's previous change (clock skew between a node and us must not reorder it).

:func:`transition` is the pure rule; the two hooks only load, apply and store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from claims.models import ClaimLifecycle, ClaimStateChange
from fleet.ingest import write_rows
from fleet.models import Cluster
from fleet.normalize import ClaimRecord

HOLDING = frozenset({"allocated", "reserved", "deallocating"})  # states in which the claim holds devices
LIFECYCLE_FIELDS = (
    "namespace", "name", "state", "created_at", "first_pending_at", "allocated_at", "node", "devices",
    "released_at", "deleted_at", "updated_at",
)  # fmt: skip
READ_CHUNK = 10_000  # uids per read: under SQLite's bound-parameter limit (32766)


@dataclass
class Life:
    """A claim's lifecycle as the hooks see it (the fields of a ``ClaimLifecycle`` row)."""

    uid: str
    namespace: str
    name: str
    state: str
    created_at: datetime | None = None
    first_pending_at: datetime | None = None
    allocated_at: datetime | None = None
    node: str = ""
    devices: list[str] = field(default_factory=list)
    released_at: datetime | None = None
    deleted_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class Change:
    """One state change (a future ``ClaimStateChange`` row)."""

    uid: str
    namespace: str
    name: str
    from_state: str
    to_state: str
    at: datetime
    node: str = ""
    devices: tuple[str, ...] = ()


def devices_of(record: ClaimRecord) -> list[str]:
    """``driver/pool/device`` of the devices the claim holds (admin-access results hold nothing)."""
    return [f"{a.driver}/{a.pool}/{a.device}" for a in record.allocations if not a.admin_access]


def _not_before(at: datetime, previous: datetime | None) -> datetime:
    return at if previous is None or at >= previous else previous


def transition(prev: Life | None, record: ClaimRecord, observed_at: datetime) -> tuple[Life, Change | None]:
    """The lifecycle after observing ``record`` (a written claim) and the change it makes, if any."""
    meta, state = record.meta, record.state
    if prev is None:
        life = Life(meta.uid, meta.namespace, meta.name, "", created_at=meta.created_at)
        # A claim first seen pending has been pending since it was created.
        at = (meta.created_at or observed_at) if state == "pending" else observed_at
    elif prev.state == state:
        return prev, None
    else:
        # Also a uid recorded deleted that is written again: it was not gone after all (a relist that
        # skipped it as malformed, an API server restored from a backup), so its life goes on.
        life = Life(**{**prev.__dict__, "devices": list(prev.devices), "deleted_at": None})
        at = observed_at
    if state in HOLDING and life.state not in HOLDING:
        at = record.allocated_at or at  # the allocation's own time when the API server gives it
    if state == "deallocating" and meta.deleted_at is not None:
        at = meta.deleted_at
    at = _not_before(at, life.updated_at)
    change_node, change_devices = "", tuple[str, ...]()
    if state == "pending":
        if life.first_pending_at is None:
            life.first_pending_at = at
        if life.state in HOLDING:  # deallocated: what it held is free again
            life.released_at = at
            change_node, change_devices = life.node, tuple(life.devices)
    elif life.state not in HOLDING:  # allocated now
        life.allocated_at, life.node, life.devices = at, record.node_name, devices_of(record)
        life.released_at = None
        change_node, change_devices = life.node, tuple(life.devices)
    change = Change(meta.uid, meta.namespace, meta.name, life.state, state, at, change_node, change_devices)
    life.state, life.updated_at = state, at
    return life, change


def deletion(prev: Life, deleted_at: datetime | None, observed_at: datetime) -> tuple[Life, Change | None]:
    """The lifecycle after the claim is gone (``deleted_at``: its deletionTimestamp, if set)."""
    if prev.state == "deleted":
        return prev, None
    life = Life(**{**prev.__dict__, "devices": list(prev.devices)})
    # A deletionTimestamp is when deletion was asked for. Seen already (state deallocating), it is recorded,
    # and the object vanishing (finalizer gone, devices free) is the observation. Unseen, it is the best time.
    at = observed_at if prev.state == "deallocating" else (deleted_at or observed_at)
    at = _not_before(at, life.updated_at)
    node, devices = "", tuple[str, ...]()
    if life.state in HOLDING:
        life.released_at = at
        node, devices = life.node, tuple(life.devices)
    change = Change(life.uid, life.namespace, life.name, life.state, "deleted", at, node, devices)
    life.state, life.deleted_at, life.updated_at = "deleted", at, at
    return life, change


# ------------------------------------------------------------------------------------------- storage


def _load(cluster: Cluster, uids: Iterable[str]) -> dict[str, Life]:
    """The stored lifecycles of ``uids``: one statement on PostgreSQL (``uid = ANY(array)``: building and
    parsing a 40k-placeholder ``IN`` list costs seconds), IN lists under SQLite's limit elsewhere."""
    wanted = sorted(set(uids))
    rows = ClaimLifecycle.objects.filter(cluster=cluster)
    if connection.vendor == "postgresql":
        found = rows.extra(where=["uid = ANY(%s)"], params=[wanted]).values("uid", *LIFECYCLE_FIELDS)
        return {row["uid"]: Life(**row) for row in found}
    out: dict[str, Life] = {}
    for start in range(0, len(wanted), READ_CHUNK):
        for row in rows.filter(uid__in=wanted[start : start + READ_CHUNK]).values("uid", *LIFECYCLE_FIELDS):
            out[row["uid"]] = Life(**row)
    return out


def _store(cluster: Cluster, lives: Sequence[Life], changes: Sequence[Change]) -> None:
    """Two bulk writes through ingest's writer (COPY on PostgreSQL; Django's bulk_create spends seconds
    preparing 40k rows field by field)."""
    write_rows(
        ClaimLifecycle,
        [{"cluster_id": cluster.pk, **life.__dict__} for life in lives],
        conflict=("cluster_id", "uid"),
    )
    write_rows(
        ClaimStateChange,
        [
            {
                "cluster_id": cluster.pk,
                "uid": c.uid,
                "namespace": c.namespace,
                "name": c.name,
                "from_state": c.from_state,
                "to_state": c.to_state,
                "at": c.at,
                "node": c.node,
                "devices": list(c.devices),
            }
            for c in changes
        ],
    )


def record_written(cluster: Cluster, records: list[Any], observed_at: datetime) -> None:
    """Ingest hook: claims upserted by a batch (precondition: ClaimRecords, fresher than what is stored)."""
    known = _load(cluster, (r.meta.uid for r in records))
    lives: dict[str, Life] = {}
    changes: list[Change] = []
    for record in records:
        prev = lives.get(record.meta.uid) or known.get(record.meta.uid)
        if prev is not None and prev.state == record.state:
            continue  # unchanged: most of a relist
        life, change = transition(prev, record, observed_at)
        if change is not None:
            lives[life.uid] = life
            changes.append(change)
    _store(cluster, list(lives.values()), changes)


def record_deleted(cluster: Cluster, gone: list[tuple[str, datetime | None]], observed_at: datetime) -> None:
    """Ingest hook: claims deleted by a batch, as ``(uid, deletionTimestamp or None)``."""
    known = _load(cluster, (uid for uid, _ in gone))
    lives: dict[str, Life] = {}
    changes: list[Change] = []
    for uid, deleted_at in gone:
        prev = lives.get(uid) or known.get(uid)
        if prev is None:  # never seen alive: nothing to close
            continue
        life, change = deletion(prev, deleted_at, observed_at)
        if change is not None:
            lives[uid] = life
            changes.append(change)
    _store(cluster, list(lives.values()), changes)


def prune(before: datetime) -> tuple[int, int]:
    """Forget history older than ``before``: state changes that happened before it, and the lifecycles of
    claims deleted before it (a live claim's lifecycle stays, however old). Returns (changes, lifecycles)."""
    changes, _ = ClaimStateChange.objects.filter(at__lt=before).delete()
    lives, _ = ClaimLifecycle.objects.filter(state="deleted", deleted_at__lt=before).delete()
    return changes, lives


def namespaces_of(cluster: str) -> set[str]:
    """The namespaces of every claim the history holds in the cluster named ``cluster``."""
    rows = ClaimLifecycle.objects.filter(cluster__name=cluster)
    return set(rows.values_list("namespace", flat=True).distinct())
