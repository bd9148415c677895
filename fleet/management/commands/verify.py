"""python manage.py verify [--cluster C] [--kind K]: database vs. a fresh list; exit 1 if they differ."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet import clusters, ingest
from fleet.kube import streams
from fleet.kube.kubesource import KubeConfigError
from fleet.kube.source import SourceError
from fleet.kube.verify import compare


class Command(BaseCommand):
    help = "Compare the stored objects with a fresh list from each cluster; print every difference."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", help="only this cluster (default: every configured one)")
        parser.add_argument("--kind", choices=streams.STREAM_KINDS, help="only this kind")

    def handle(self, *args: Any, **options: Any) -> None:
        kinds = [options["kind"]] if options["kind"] else list(streams.STREAM_KINDS)
        try:
            configs = clusters.select(options["cluster"])
        except clusters.ClusterConfigError as exc:
            raise CommandError(str(exc)) from None
        if not configs:
            raise CommandError(f"no clusters configured: set {clusters.ENV}")
        differences = 0
        for config in configs:
            try:
                source = config.source()
                found = compare(ingest.get_or_create_cluster(config.name), source, kinds)
            except (KubeConfigError, SourceError) as exc:
                raise CommandError(f"cluster {config.name}: {exc}") from None
            for difference in found:
                self.stdout.write(str(difference))
            differences += len(found)
            status = "in sync" if not found else f"{len(found)} difference(s)"
            self.stdout.write(f"{config.name}: {status} ({', '.join(kinds)})")
        if differences:
            sys.exit(1)
