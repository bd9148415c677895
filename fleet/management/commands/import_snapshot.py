"""python manage.py import_snapshot FILE... --cluster NAME [--replace]"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet import importer, ingest
from fleet.snapshot import SnapshotError, by_kind, read_files


class Command(BaseCommand):
    help = (
        "Import `kubectl get ... -o yaml|json` output (a List, one object, or several YAML documents) into a "
        "named cluster: ResourceSlices, DeviceClasses, ResourceClaims(Templates), Nodes, GPU Pods and Events."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("files", nargs="+", metavar="FILE")
        parser.add_argument("--cluster", required=True, help="cluster name (created when new)")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="forget everything stored for the cluster first (its history and diagnoses too), then "
            "import: for re-importing edited files whose objects kept their resourceVersion",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            objects = read_files(options["files"])
        except SnapshotError as exc:
            raise CommandError(str(exc)) from None
        grouped, skipped = by_kind(objects)
        if options["replace"]:
            ingest.drop_cluster(options["cluster"])
        cluster = ingest.get_or_create_cluster(options["cluster"])
        report = importer.import_objects(cluster, grouped)
        for kind in importer.INGEST_ORDER:
            if report.written.get(kind) or report.unchanged.get(kind) or report.filtered.get(kind):
                line = f"{kind}: {report.written.get(kind, 0)} written"
                if report.unchanged.get(kind):
                    line += f", {report.unchanged[kind]} unchanged"
                if report.filtered.get(kind):
                    line += f", {report.filtered[kind]} not relevant (no GPU claims / reason not tracked)"
                self.stdout.write(line)
        if skipped:
            self.stdout.write("ignored kinds: " + ", ".join(skipped))
        if report.completed:
            self.stdout.write(
                f"{report.completed} hand-written object(s) had no metadata.uid or resourceVersion: given a "
                "stable uid and the import's time as resourceVersion (a re-import of an edit replaces them)"
            )
        if unchanged := sum(report.unchanged.values()):
            # Ingest keeps what is stored at the same or a newer resourceVersion (the same object, as far
            # as Kubernetes is concerned): say so, or an edited file would seem imported.
            self.stdout.write(
                f"{unchanged} object(s) were already stored at the same or a newer resourceVersion and "
                "were left as stored; to import edited objects, raise their metadata.resourceVersion "
                "or pass --replace"
            )
        for error in report.errors:
            self.stderr.write(f"skipped malformed object: {error}")
        if report.errors:
            raise CommandError(f"{len(report.errors)} object(s) could not be read; the others were imported")
