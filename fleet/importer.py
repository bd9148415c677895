"""Objects -> normalize -> ingest, with per-object error reporting (one bad object never stops a batch)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet import ingest
from fleet.models import Cluster
from fleet.normalize import KINDS, NormalizeError, is_stored, normalize

log = logging.getLogger(__name__)

# Parents before children so a page reload in between shows a consistent picture.
INGEST_ORDER = (
    "DeviceClass",
    "Node",
    "ResourceSlice",
    "ResourceClaimTemplate",
    "ResourceClaim",
    "Pod",
    "Event",
)
assert set(INGEST_ORDER) == set(KINDS)


@dataclass
class ImportReport:
    written: dict[str, int] = field(default_factory=dict)
    # Already stored at the same or a newer resourceVersion: left as stored (the version fence).
    unchanged: dict[str, int] = field(default_factory=dict)
    filtered: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def normalize_many(kind: str, objects: Iterable[dict[str, Any]], report: ImportReport) -> list[Any]:
    records = []
    for obj in objects:
        try:
            if not is_stored(kind, obj):
                report.filtered[kind] = report.filtered.get(kind, 0) + 1
                continue
            records.append(normalize(kind, obj))
        except NormalizeError as exc:
            log.warning("skipping malformed object: %s", exc)
            report.errors.append(str(exc))
    return records


def import_objects(cluster: Cluster, grouped: dict[str, list[dict[str, Any]]]) -> ImportReport:
    report = ImportReport()
    for kind in INGEST_ORDER:
        records = normalize_many(kind, grouped.get(kind, []), report)
        if records:
            changes = [ingest.Change("upsert", r) for r in records]
            result = ingest.apply_batch(cluster, kind, changes)
            report.written[kind] = len(result.written)
            report.unchanged[kind] = result.stale
    return report
