"""python manage.py demo_login — create (or reset) the demo user and print its password."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from fleet.access.visibility import grant_all_namespaces

DEMO_USER = "demo"


def demo_password() -> str:
    """A per-machine password kept in the data folder (never a password in the repository)."""
    path = Path(settings.DATA_DIR) / "demo-password"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(12)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(password)
    return password


def ensure_demo_user() -> str:
    """The demo user exists with the data folder's password; returns the password."""
    password = demo_password()
    user, _ = get_user_model().objects.get_or_create(username=DEMO_USER, defaults={"is_staff": True})
    user.set_password(password)
    user.save()
    # The demo shows the whole simulated fleet: its user sees every namespace (docs/operations.md).
    grant_all_namespaces(user)
    return password


class Command(BaseCommand):
    help = "Create or reset the 'demo' user (password kept in the data folder) and print the password."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(ensure_demo_user())
