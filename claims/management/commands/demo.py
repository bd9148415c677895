"""python manage.py demo — the one-command demo: migrate, demo login, simulated live fleet, ASGI server."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from claims import demo
from claims.management.commands.demo_login import DEMO_USER, ensure_demo_user


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
        self.stdout.write("simulating the weekend (Friday 17:00 to Monday 09:00, ending now)...")
        running = demo.start(seed=options["seed"], speed=options["speed"])
        if not demo.wait_synced():
            self.stderr.write("warning: the simulated streams have not all synced yet; see the log")
        self.stdout.write(self.style.SUCCESS(f"claimscope demo: {url}  login: {DEMO_USER} / {password}"))
        # The weekend ended at start-up, whatever the weekday: the triage's default window (the last 24 h
        # on Tuesday to Friday) would cut it, so the link names the weekend's own window.
        self.stdout.write(
            f"weekend triage ({_when(running.triage_since)} to {_when(running.weekend_end)} UTC): "
            f"{url}claims/triage/?since={_iso(running.triage_since)}"
        )
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


def _iso(at: datetime) -> str:
    """A URL-safe ISO 8601 UTC time (no "+": it would read as a space in a query string)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%a %Y-%m-%d %H:%M")
