"""python manage.py simulate — a simulated GPU cluster behind the Kubernetes API protocol."""

from __future__ import annotations

import json
import secrets
import signal
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from simulator import dcgm, demo
from simulator.apiserver import SimulatorAPIServer


class Command(BaseCommand):
    help = (
        "Serve a simulated GPU cluster (the monday weekend, then live churn) over the Kubernetes list/watch "
        "HTTP protocol on 127.0.0.1, and write a kubeconfig for it. Workers watch it like a real cluster."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--speed", type=float, default=60.0, help="simulated seconds per real second")
        parser.add_argument(
            "--kubeconfig",
            default=None,
            help="where to write the kubeconfig (default: <data dir>/simulator.kubeconfig)",
        )
        parser.add_argument(
            "--dcgm-port",
            type=int,
            default=None,
            help="also serve the dcgm-exporter stand-in on this port (0: free)",
        )
        parser.add_argument(
            "--dcgm-target-file",
            default=None,
            help="write the stand-in's address as a Prometheus file_sd target group to this file",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["speed"] <= 0:
            raise CommandError("--speed must be a positive number of simulated seconds per second")
        path = Path(options["kubeconfig"] or Path(settings.DATA_DIR) / "simulator.kubeconfig")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.stdout.write("simulating the weekend (Friday 17:00 to Monday 09:00)...")
        simulation = demo.prepare(options["seed"])
        try:
            server = SimulatorAPIServer(simulation.cluster, secrets.token_urlsafe(24), port=options["port"])
        except OSError as exc:
            raise CommandError(f"cannot listen on 127.0.0.1:{options['port']}: {exc.strerror}") from None
        server.write_kubeconfig(path)
        stop = threading.Event()
        churn = threading.Thread(
            target=demo.churn, args=(simulation, stop, options["speed"]), name="simulate-churn", daemon=True
        )
        churn.start()
        server.serve_in_thread()
        self.stdout.write(self.style.SUCCESS(f"simulated cluster at {server.url}; kubeconfig: {path}"))
        exporter = None
        if options["dcgm_port"] is not None:
            exporter = dcgm.DcgmExporter(
                lambda: dcgm.cluster_series(simulation.cluster, dcgm.now()), port=options["dcgm_port"]
            )
            exporter.start()
            self.stdout.write(self.style.SUCCESS(f"dcgm-exporter stand-in at {exporter.url}"))
            if options["dcgm_target_file"]:
                target = Path(options["dcgm_target_file"])
                group = [{"targets": [f"127.0.0.1:{exporter.port}"], "labels": {"run": "demo-stack"}}]
                tmp = target.with_suffix(".tmp")
                tmp.write_text(json.dumps(group))
                tmp.rename(target)  # Prometheus never reads half a file
        self.stdout.flush()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()
            server.stop()
            if exporter is not None:
                exporter.stop()
