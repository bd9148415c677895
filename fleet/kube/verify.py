"""Compare the database with a fresh list from the source: what is missing, extra (ghosts) or stale.

Meant for a quiet moment (or a test after convergence): an object that changes between the list and the
comparison shows up as a difference, which a second run clears.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet import ingest
from fleet.importer import ImportReport, normalize_many
from fleet.kube.source import Source, list_pages
from fleet.models import Cluster, WatchCursor


@dataclass(frozen=True)
class Difference:
    """One disagreement: ``problem`` is missing (in the cluster, not stored), ghost (stored, gone from the
    cluster), stale (stored at an older resourceVersion), replaced (same name, another uid) or not synced
    (the stream has no cursor yet)."""

    cluster: str
    kind: str
    key: str
    problem: str
    detail: str = ""

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.cluster} {self.kind} {self.key}: {self.problem}{detail}"


def compare(cluster: Cluster, source: Source, kinds: Iterable[str]) -> list[Difference]:
    out: list[Difference] = []
    for kind in kinds:
        out.extend(compare_kind(cluster, source, kind))
    return out


def compare_kind(cluster: Cluster, source: Source, kind: str) -> list[Difference]:
    spec = ingest.SPECS[kind]
    out = []
    cursor = WatchCursor.objects.filter(cluster=cluster, kind=kind).first()
    if cursor is None or cursor.state in ("idle", "listing"):
        # Rows may still match (an empty cluster), but nothing guarantees they will follow changes.
        out.append(Difference(cluster.name, kind, "*", "not synced", "the stream has not listed yet"))
    # Page by page, keeping only each object's key, uid and resourceVersion: at XL one kind decoded whole
    # (~58,000 slices, ~1M devices) is several GB, the keys a few MB.
    _, pages = list_pages(source, kind)
    live: dict[tuple[str, ...], tuple[str, int]] = {}
    for page in pages:
        for record in normalize_many(kind, page, ImportReport()):
            live[spec.key_of(record)] = (record.meta.uid, record.meta.resource_version)
    stored = {
        tuple(row[:-2]): (row[-2], int(row[-1]))
        for row in spec.model._default_manager.filter(cluster=cluster).values_list(
            *spec.natural_key, "uid", "resource_version"
        )
    }

    def diff(key: tuple[str, ...], problem: str, detail: str = "") -> None:
        out.append(Difference(cluster.name, kind, "/".join(key), problem, detail))

    for key, (live_uid, live_rv) in sorted(live.items()):
        if key not in stored:
            diff(key, "missing")
            continue
        uid, rv = stored[key]
        if uid != live_uid:
            diff(key, "replaced", f"stored uid {uid}, live uid {live_uid}")
        elif rv < live_rv:
            diff(key, "stale", f"stored resourceVersion {rv}, live {live_rv}")
    for key in sorted(set(stored) - set(live)):
        diff(key, "ghost")
    return out
