"""Objects -> normalize -> ingest, with per-object error reporting (one bad object never stops a batch)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from fleet import ingest
from fleet.ingest import gpu_state
from fleet.models import Cluster
from fleet.normalize import KINDS, NormalizeError, is_stored, normalize

log = logging.getLogger(__name__)

# Parents before children so a page reload in between shows a consistent picture.
INGEST_ORDER = (
    "DeviceClass",
    "Node",
    "ResourceSlice",
    "DeviceTaintRule",
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
    # Hand-written manifests (no metadata.uid or resourceVersion) given the identity the API server would.
    completed: int = 0


def complete_hand_written(cluster: str, kind: str, obj: Any) -> bool:
    """Give a manifest as written by hand (what ``kubectl apply`` and ``explain --fleet`` take: no
    ``metadata.uid`` nor ``resourceVersion``) what the API server would have added: a uid, stable per
    (cluster, kind, namespace, name) so that a re-import updates the same object, and a resourceVersion
    newer than any import before (the clock), so that an edited file replaces what is stored. Objects the
    API server returned are left alone; True when something was added."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return False  # normalize reports what is missing
    added = False
    if not meta.get("uid"):
        key = f"claimscope:{cluster}/{kind}/{meta.get('namespace') or ''}/{meta['name']}"
        meta["uid"] = str(uuid.uuid5(uuid.NAMESPACE_URL, key))
        added = True
    if meta.get("resourceVersion") in (None, ""):
        meta["resourceVersion"] = str(time.time_ns())
        added = True
    return added


def normalize_many(
    kind: str, objects: Iterable[dict[str, Any]], report: ImportReport, cluster: str = ""
) -> list[Any]:
    """Records of ``objects``; with ``cluster``, hand-written manifests are completed first (imports)."""
    records = []
    for obj in objects:
        if cluster and complete_hand_written(cluster, kind, obj):
            report.completed += 1
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
    """Normalize and store every kind of a snapshot in one transaction: a page never shows half an
    import, a failure stores nothing, and the per-GPU read model is recomputed once for all kinds."""
    report = ImportReport()
    with transaction.atomic(), gpu_state.one_refresh():
        for kind in INGEST_ORDER:
            records = normalize_many(kind, grouped.get(kind, []), report, cluster.name)
            if records:
                changes = [ingest.Change("upsert", r) for r in records]
                result = ingest.apply_batch(cluster, kind, changes)
                report.written[kind] = len(result.written)
                report.unchanged[kind] = result.stale
    if report.written:
        ingest.notify_imported(cluster)
    return report
