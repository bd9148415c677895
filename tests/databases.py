"""Which database a test run is on, and the guard that makes a run on the wrong one fail loudly.

Pages, API, websocket, triage and security tests run twice in `make test`: on PostgreSQL (the production
configuration) and on SQLite (the embedded default that `make demo` uses). `CLAIMSCOPE_TEST_DATABASE` names
the backend a run expects; `scripts/test.sh` sets it for each pass. Without it PostgreSQL is expected, so a
run that silently fell back to SQLite (DATABASE_URL missing) fails instead of passing on the wrong backend.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

BACKENDS = ("postgresql", "sqlite")


def expected_backend() -> str:
    name = os.environ.get("CLAIMSCOPE_TEST_DATABASE", "postgresql")
    if name not in BACKENDS:
        pytest.fail(f"CLAIMSCOPE_TEST_DATABASE={name!r}: expected one of {', '.join(BACKENDS)}")
    return name


def require_expected_backend(suite: str) -> None:
    """Fail (never skip) when the connected backend is not the one this run expects."""
    expected = expected_backend()
    if connection.vendor != expected:
        pytest.fail(
            f"{suite} tests expected {expected} (CLAIMSCOPE_TEST_DATABASE), got the {connection.vendor} "
            "backend: run `make test`, which starts PostgreSQL and runs both passes"
        )


def require_postgresql(suite: str) -> None:
    """For suites about PostgreSQL itself (bulk ingest, COPY, locks): they have no SQLite pass."""
    if connection.vendor != "postgresql":
        pytest.fail(f"{suite} tests need PostgreSQL (run `make test`), got the {connection.vendor} backend")
