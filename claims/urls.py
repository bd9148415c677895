"""Claim pages: pending claims, diagnosis, triage."""

from typing import Any

app_name = "claims"
urlpatterns: list[Any] = []
