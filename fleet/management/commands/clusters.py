"""python manage.py clusters: every stream's state, cursor, stored objects, last event and last error.

The state is ``stale`` when no worker has vouched for the stream within its lease (``stream_status``):
then the state a worker last wrote follows in brackets, e.g. ``stale (watching)``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from fleet import clusters, ingest
from fleet.kube import streams
from fleet.models import Cluster, WatchCursor

ROW = "{:16} {:22} {:20} {:>12} {:>8} {:20} {}"


class Command(BaseCommand):
    help = "Show each (cluster, kind) stream: state, resourceVersion, objects stored, last event, last error."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            configured = {c.name: c for c in clusters.configured()}
        except clusters.ClusterConfigError as exc:
            raise CommandError(str(exc)) from None
        names = sorted(set(configured) | set(Cluster.objects.values_list("name", flat=True)))
        if not names:
            self.stdout.write(f"no clusters: set {clusters.ENV} (see docs/watchers.md)")
            return
        cursors = {(c.cluster.name, c.kind): c for c in WatchCursor.objects.select_related("cluster")}
        now = timezone.now()
        self.stdout.write(ROW.format("cluster", "kind", "state", "cursor", "objects", "last event", "error"))
        for name in names:
            source = configured[name].describe() if name in configured else "not configured"
            self.stdout.write(f"{name}: {source}")
            cluster = Cluster.objects.filter(name=name).first()
            for kind in streams.STREAM_KINDS:
                cursor = cursors.get((name, kind))
                manager = ingest.SPECS[kind].model._default_manager
                objects = manager.filter(cluster=cluster).count() if cluster else 0
                self.stdout.write(ROW.format(name, kind, *_cursor_columns(cursor, objects, now)))


def _cursor_columns(
    cursor: WatchCursor | None, objects: int, now: datetime
) -> tuple[str, str, int, str, str]:
    if cursor is None:
        return "-", "-", objects, "-", ""
    last = cursor.last_event_at.strftime("%Y-%m-%d %H:%M:%S") if cursor.last_event_at else "-"
    error = (cursor.last_error.splitlines() or [""])[0][:160]
    state = cursor.status(now)
    if state != cursor.state:
        state = f"{state} ({cursor.state})"
    return state, str(cursor.resource_version), objects, last, error
