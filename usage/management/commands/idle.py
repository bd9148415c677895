"""``manage.py idle``: claims that held GPUs idle, from the stored utilization samples."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from usage.report import SECTIONS, WindowError, idle_report, section_rows, text
from web.renderers import CSVRenderer, dumps


class Command(BaseCommand):
    help = "Claims that held GPUs idle in a window, and idle GPU-hours per namespace and model."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", help="ISO 8601, a duration ago (24h, 7d) or now; default 24h")
        parser.add_argument("--until", help="ISO 8601, a duration ago or now (default)")
        parser.add_argument(
            "--below", help="mean activity threshold in percent (default CLAIMSCOPE_IDLE_BELOW_PERCENT)"
        )
        parser.add_argument("--cluster", help="only this cluster")
        parser.add_argument("--format", choices=("text", "json", "csv"), default="text")
        parser.add_argument("--section", choices=SECTIONS, default="claims", help="with --format csv")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = idle_report(options["since"], options["until"], options["below"], options["cluster"])
        except WindowError as exc:
            raise CommandError(f"--{exc.parameter}: {exc.message}") from None
        if options["format"] == "json":
            self.stdout.write(dumps(report).decode())
        elif options["format"] == "csv":
            # The API's renderer, so the command's CSV is the endpoint's, byte for byte.
            body = CSVRenderer().render(section_rows(report, options["section"]))
            self.stdout.write(body.decode(), ending="")
        else:
            self.stdout.write(text(report), ending="")
