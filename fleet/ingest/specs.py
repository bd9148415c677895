"""The kind registry: how each watched kind is stored (:class:`TableSpec`), and what a batch is and did."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.db import models

from fleet.models import Cluster
from fleet.normalize import Record

Op = Literal["upsert", "delete"]


@dataclass(frozen=True, slots=True)
class Change:
    """One watch event, normalized: an upsert of a record, or a delete of it."""

    op: Op
    record: Record


@dataclass(frozen=True)
class ChildSpec:
    """Rows derived from a parent record (devices of a slice, allocations of a claim), replaced with it."""

    model: type[models.Model]
    parent_column: str  # the child's column holding the parent's key value
    parent_field: str  # the parent's column it refers to ("name" for slices, "uid" for claims)
    parent_value: Callable[[Any], str]  # that value from the parent record
    rows: Callable[[Any], list[dict[str, Any]]]
    conflict: tuple[str, ...]
    # A child published by two parents at once keeps the one with the highest value here (a device in
    # an old and a new pool generation's slice keeps the newer), whatever order the parents come in.
    fence: str | None = None


@dataclass(frozen=True)
class TableSpec:
    """How one Kubernetes kind is stored."""

    model: type[models.Model]
    natural_key: tuple[str, ...]  # columns after cluster_id, e.g. ("namespace", "name")
    row: Callable[[Any], dict[str, Any]]
    children: tuple[ChildSpec, ...] = ()
    # Optional hooks (claims records claim state changes with them; DeviceTaintRules re-taint the devices
    # they select), called once per batch inside
    # its transaction with the batch's observation time: ``on_written(cluster, records written, observed_at)``
    # (stale records left out) and ``on_deleted(cluster, [(uid, deletionTimestamp or None)], observed_at)``.
    # They must stay bulk: a constant number of statements per call, whatever the batch size.
    on_written: Callable[[Cluster, list[Any], datetime], None] | None = None
    on_deleted: Callable[[Cluster, list[tuple[str, datetime | None]], datetime], None] | None = None

    def key_of(self, record: Any) -> tuple[str, ...]:
        return record.meta.key if "namespace" in self.natural_key else (record.meta.name,)


SPECS: dict[str, TableSpec] = {}


def register(kind: str, spec: TableSpec) -> None:
    SPECS[kind] = spec


@dataclass
class BatchResult:
    """What a batch changed: natural keys written (inserted or updated) and deleted, and what was stale."""

    kind: str
    written: list[tuple[str, ...]] = field(default_factory=list)
    deleted: list[tuple[str, ...]] = field(default_factory=list)
    stale: int = 0
    resync: bool = False  # a relist (replace_all): its change event names its keys only when few
    # (driver, pool) of every device or allocation row the batch may have written or deleted, old and new:
    # the heatmap re-reads only these pools. None: not known (a relist, or not PostgreSQL).
    pools: set[tuple[str, str]] | None = None

    @property
    def changed(self) -> bool:
        return bool(self.written or self.deleted)


@dataclass(frozen=True)
class CursorUpdate:
    """The stream position to save in the same transaction as the batch."""

    resource_version: int
    state: str = "watching"
    objects: int | None = None


# ------------------------------------------------------------------------------------------- public API


def kinds() -> Iterable[str]:
    return SPECS.keys()
