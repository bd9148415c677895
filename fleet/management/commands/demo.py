"""python manage.py demo — the one-command demo: migrate, demo login, simulated fleet, ASGI server."""

from __future__ import annotations

import io
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

DEMO_USER = "demo"


def demo_password() -> str:
    """A per-machine password kept in the data folder (never a password in the repository)."""
    path = Path(settings.DATA_DIR) / "demo-password"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(12)
    path.write_text(password)
    path.chmod(0o600)
    return password


class Command(BaseCommand):
    help = "Migrate, create the demo login, load a simulated fleet and serve the dashboard (Ctrl-C stops)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--no-serve", action="store_true", help="prepare everything, do not start the server"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        password = demo_password()
        user, _ = get_user_model().objects.get_or_create(username=DEMO_USER, defaults={"is_staff": True})
        user.set_password(password)
        user.save()
        self._load_fleet()
        url = f"http://{options['host']}:{options['port']}/"
        self.stdout.write(self.style.SUCCESS(f"claimscope demo: {url}  login: {DEMO_USER} / {password}"))
        if options["no_serve"]:
            return
        import uvicorn

        try:
            uvicorn.run(
                "dashboard.asgi:application", host=options["host"], port=options["port"], log_level="info"
            )
        except OSError as exc:
            raise CommandError(
                f"cannot listen on {options['host']}:{options['port']}: {exc.strerror}"
            ) from None

    def _load_fleet(self) -> None:
        fixture = Path(settings.BASE_DIR) / "tests" / "fixtures" / "fleet-small.yaml"
        if fixture.exists():
            call_command("import_snapshot", str(fixture), cluster="demo", stdout=io.StringIO())
