"""Migration claims 0009 (one stored diagnosis per claim shape), forwards and back, with rows to move."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from claims.models import ClaimDiagnosis, DiagnosisShape
from fleet import ingest
from fleet.models import ResourceClaim
from tests.db.test_ingest import claim_record, upserts

pytestmark = pytest.mark.django_db(transaction=True)


def columns() -> set[str]:
    with connection.cursor() as cursor:
        return {
            c.name for c in connection.introspection.get_table_description(cursor, "claims_claimdiagnosis")
        }


def count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM claims_claimdiagnosis")
        return int(cursor.fetchone()[0])


def test_the_shape_migration_drops_the_derived_rows_both_ways() -> None:
    cluster = ingest.get_or_create_cluster("migrated")
    ingest.apply_batch(cluster, "ResourceClaim", upserts(claim_record("a", 5)))
    claim = ResourceClaim.objects.get(cluster=cluster, name="a")
    call_command("migrate", "claims", "0008", verbosity=0)
    try:
        # A diagnosis as the previous release stored it: its result in the claim's own row.
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO claims_claimdiagnosis"
                " (claim_id, category, summary, result, group_key, computed_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [claim.pk, "capacity", "-", json.dumps({"category": "capacity"}), "", timezone.now()],
            )
        call_command("migrate", "claims", "0009", verbosity=0)
        assert count() == 0  # derived: the worker's first run stores it again
        assert {"shape_id", "pod_name"} <= columns() and "result" not in columns()
        shape = DiagnosisShape.objects.create(
            cluster=cluster, key="k", category="capacity", summary="-", computed_at=timezone.now()
        )
        ClaimDiagnosis.objects.create(claim=claim, shape=shape)
        call_command("migrate", "claims", "0008", verbosity=0)  # back, with a row of the new kind
        assert count() == 0 and "result" in columns() and "shape_id" not in columns()
    finally:
        call_command("migrate", verbosity=0)
    assert "shape_id" in columns()
