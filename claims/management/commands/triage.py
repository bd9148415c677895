"""python manage.py triage [--since WHEN] [--until WHEN] [--cluster C] [--format text|json|csv] [--section S]

The triage report (``claims.triage``) for a window, the same data as the triage page and ``/api/v1/triage/``.
WHEN is an ISO 8601 time, a weekday and time ("friday 18:00": the last one before --until), a duration ago
(24h, 3d) or "now". Default window: since the last Friday 18:00 on Saturday to Monday, else the last 24 h.
The command sees every namespace (it runs with the operator's database access).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from claims.triage.report import SECTIONS, as_text, section_rows
from claims.triage.selectors import UnknownCluster, report
from claims.triage.window import WindowError
from web.renderers import CSVRenderer, dumps


class Command(BaseCommand):
    help = "Report what pended in a window, why, what freed capacity, allocation per model and leaks."

    def add_arguments(self, parser: CommandParser) -> None:
        when = "ISO 8601 time, 'friday 18:00', '24h' (ago) or 'now'"
        parser.add_argument("--since", default=None, help=f"start ({when}); default: see the docs")
        parser.add_argument("--until", default=None, help=f"end ({when}); default: now")
        parser.add_argument("--cluster", default=None, help="only this cluster")
        parser.add_argument("--format", choices=("text", "json", "csv"), default="text")
        parser.add_argument(
            "--section",
            choices=SECTIONS,
            default="pended",
            help="with --format csv: which list (default pended)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            data = report(options["since"], options["until"], options["cluster"], lambda _c, _n: True)
        except WindowError as exc:
            raise CommandError(f"--{exc.parameter}: {exc.message}") from None
        except UnknownCluster as exc:
            raise CommandError(f"--cluster: {exc}") from None
        fmt = options["format"]
        if fmt == "json":
            self.stdout.write(dumps(data).decode())
        elif fmt == "csv":
            self.stdout.write(
                CSVRenderer().render(section_rows(data, options["section"])).decode(), ending=""
            )
        else:
            self.stdout.write(as_text(data), ending="")
