"""python manage.py fleet_summary [--cluster C] [--json]"""

from __future__ import annotations

from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet import selectors
from fleet.counts import LEGEND
from fleet.models import Cluster
from fleet.quantity import format_bytes


class Command(BaseCommand):
    help = (
        "Devices per model, kind and MIG profile by state (free, reserved, allocated unreserved, "
        "unavailable) and tainted, and physical GPUs per model (whole, static MIG, partitionable, "
        "allocated whole, tainted) with allocated compute slices (partition-aware: MIG slices never add "
        "to their GPU). A legend explains each column."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", help="only this cluster (default: all)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster_id = None
        if options["cluster"]:
            try:
                cluster_id = Cluster.objects.get(name=options["cluster"]).pk
            except Cluster.DoesNotExist:
                known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
                raise CommandError(f"no cluster named {options['cluster']!r} (known: {known})") from None
        summary = selectors.fleet_summary(cluster_id)
        if options["json"]:
            self.stdout.write(orjson.dumps(summary.as_dict(), option=orjson.OPT_INDENT_2).decode())
            return
        self.stdout.write(f"{summary.devices} devices, {summary.allocated} allocated\n")
        self.stdout.write(
            f"{'model':8} {'GPUs':>6} {'whole':>6} {'static':>6} {'dyn':>6} {'wholeA':>6} {'taint':>6} "
            f"{'slices used':>14} {'alloc':>6}"
        )
        for m in summary.models:
            used = f"{m.compute_slices_allocated}/{m.compute_slices}"
            fraction = f"{m.allocated_fraction:.0%}"
            self.stdout.write(
                f"{m.model:8} {m.gpus:>6} {m.gpus_full:>6} {m.gpus_static_mig:>6} {m.gpus_dynamic:>6} "
                f"{m.gpus_whole_allocated:>6} {m.gpus_tainted:>6} {used:>14} {fraction:>6}"
            )
        self.stdout.write("")
        header = (
            f"{'model':8} {'kind':8} {'profile':14} {'total':>6} {'free':>6} {'resv':>6} {'unresv':>6} "
            f"{'unav':>6} {'taint':>6} {'memory':>10}"
        )
        self.stdout.write(header)
        for g in summary.groups:
            self.stdout.write(
                f"{g.model:8} {g.kind:8} {g.profile or '-':14} {g.total:>6} {g.free:>6} {g.reserved:>6} "
                f"{g.unreserved:>6} {g.unavailable:>6} {g.tainted:>6} {format_bytes(g.memory_bytes):>10}"
            )
        self.stdout.write("")
        for line in LEGEND_LINES:
            self.stdout.write(line)


# The columns, explained (fleet.counts.LEGEND), per table.
LEGEND_LINES = [
    "GPU columns:",
    *(
        f"  {column:7} {LEGEND[key]}"
        for column, key in (
            ("GPUs", "gpus"),
            ("whole", "gpus_full"),
            ("static", "gpus_static_mig"),
            ("dyn", "gpus_dynamic"),
            ("wholeA", "gpus_whole_allocated"),
            ("taint", "gpus_tainted"),
        )
    ),
    "Device columns (total = free + resv + unresv + unav):",
    *(
        f"  {column:7} {LEGEND[key]}"
        for column, key in (
            ("free", "free"),
            ("resv", "reserved"),
            ("unresv", "unreserved"),
            ("unav", "unavailable"),
            ("taint", "tainted"),
            ("memory", "memory"),
        )
    ),
]
