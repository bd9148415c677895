"""Compare the database with a fresh list from the source: what is missing, extra (ghosts) or stale.

Meant for a quiet moment (or a test after convergence): an object that changes between the list and the
comparison shows up as a difference, which a second run clears.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet import ingest
from fleet.importer import ImportReport, normalize_many
from fleet.kube.source import Source
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
    items, _ = source.list(kind)
    live = {spec.key_of(r): r.meta for r in normalize_many(kind, items, ImportReport())}
    stored = {
        tuple(row[:-2]): (row[-2], int(row[-1]))
        for row in spec.model._default_manager.filter(cluster=cluster).values_list(
            *spec.natural_key, "uid", "resource_version"
        )
    }

    def diff(key: tuple[str, ...], problem: str, detail: str = "") -> None:
        out.append(Difference(cluster.name, kind, "/".join(key), problem, detail))

    for key, meta in sorted(live.items()):
        if key not in stored:
            diff(key, "missing")
            continue
        uid, rv = stored[key]
        if uid != meta.uid:
            diff(key, "replaced", f"stored uid {uid}, live uid {meta.uid}")
        elif rv < meta.resource_version:
            diff(key, "stale", f"stored resourceVersion {rv}, live {meta.resource_version}")
    for key in sorted(set(stored) - set(live)):
        diff(key, "ghost")
    return out
