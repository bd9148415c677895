"""python manage.py demo — the one-command demo: migrate, demo login, simulated live fleet, ASGI server."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from simulator import demo
from simulator.management.commands.demo_login import DEMO_USER, ensure_demo_user


class Command(BaseCommand):
    help = (
        "Migrate, create the demo login, simulate a GPU fleet (the 'monday' weekend, then live churn) and "
        "serve the dashboard. Ctrl-C stops everything."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--seed", type=int, default=0, help="simulator seed (same seed, same fleet)")
        parser.add_argument(
            "--speed",
            type=float,
            default=60.0,
            help="how many times faster than real time the live week after the weekend unfolds "
            "(its workloads are compressed; the clock stays real)",
        )
        parser.add_argument("--no-serve", action="store_true", help="prepare and sync, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["speed"] <= 0:
            raise CommandError("--speed must be a positive number (how many times faster than real time)")
        call_command("migrate", verbosity=0, interactive=False)
        password = ensure_demo_user()
        url = f"http://{options['host']}:{options['port']}/"
        self.stdout.write(
            "replaying the simulated weekend (the scenario's Friday 17:00 to Monday 09:00), ending now..."
        )
        running = demo.start(seed=options["seed"], speed=options["speed"])
        if not demo.wait_synced():
            self.stderr.write("warning: the simulated streams have not all synced yet; see the log")
        self.stdout.write(self.style.SUCCESS(f"claimscope demo: {url}  login: {DEMO_USER} / {password}"))
        self.stdout.write(triage_line(url, running.triage_since, running.weekend_end))
        self.stdout.flush()  # the URL must show at once, also when the output goes to a file
        try:
            if not options["no_serve"]:
                self._serve(options["host"], options["port"])
        finally:
            running.shutdown()

    def _serve(self, host: str, port: int) -> None:
        import uvicorn

        try:
            # No proxy headers: the app believes them from TRUSTED_PROXIES only (dashboard.security).
            uvicorn.run(
                "dashboard.asgi:application", host=host, port=port, log_level="info", proxy_headers=False
            )
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def triage_line(url: str, since: datetime, until: datetime) -> str:
    """The start-up line linking the replayed weekend's triage report.

    The weekend is moved to end at start-up, whatever the weekday, so its window is named by what it is (the
    hours replayed before start-up, with their real weekdays), not "weekend"; and the link's window is the
    one printed (``until`` too: without it the report would run on into the live week)."""
    hours = round((until - since).total_seconds() / 3600)
    return (
        f"triage of the {hours} h replayed before start-up (the scenario's Friday 18:00 to Monday 09:00), "
        f"{_when(since)} to {_when(until)} UTC: {url}claims/triage/?since={_iso(since)}&until={_iso(until)}"
    )


def _iso(at: datetime) -> str:
    """A URL-safe ISO 8601 UTC time (no "+": it would read as a space in a query string)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%a %Y-%m-%d %H:%M")
