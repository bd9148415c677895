"""Database tests run on the real PostgreSQL that `make test` starts; they fail (not skip) without it."""

import pytest
from django.db import connection


@pytest.fixture(autouse=True)
def _require_postgresql(db):
    if connection.vendor != "postgresql":
        pytest.fail(
            "database tests need PostgreSQL: run `make test` (it starts one and sets DATABASE_URL), "
            f"got the {connection.vendor} backend"
        )
