"""python manage.py watch [--cluster C] [--kind K]: the watch loop in the foreground (Ctrl-C stops it)."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet import clusters
from fleet.kube import foreground, streams


class Command(BaseCommand):
    help = "List and watch every (cluster, kind) stream into the database, in this process."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", help="only this cluster (default: every configured one)")
        parser.add_argument("--kind", choices=streams.STREAM_KINDS, action="append", help="only these kinds")
        parser.add_argument(
            "--no-lock", action="store_true", help="do not take the Redis stream locks (default: take them)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            configs = clusters.select(options["cluster"])
            for config in configs:
                streams.source_for(config)  # a bad kubeconfig fails here, before any thread starts
        except (clusters.ClusterConfigError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if not configs:
            raise CommandError(f"no clusters configured: set {clusters.ENV} (see docs/watchers.md)")
        kinds = options["kind"] or list(streams.STREAM_KINDS)
        use_lock = bool(settings.REDIS_URL) and not options["no_lock"]
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        threads = foreground.start(configs, kinds, stop, use_lock)
        self.stderr.write(f"watching {len(threads)} stream(s) of {', '.join(c.name for c in configs)}")
        while not stop.wait(1.0):
            pass
        self.stderr.write("stopping")
        for thread in threads:
            thread.join(10)
