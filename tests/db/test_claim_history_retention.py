"""Retention of the claim history: old changes, deleted claims' lifecycles and old pending causes go; the
lifecycle of a claim that still exists stays, however old."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from claims.models import ClaimLifecycle, ClaimStateChange, PendingCause
from claims.tasks import prune_claim_history
from fleet import ingest
from fleet.ingest import Change
from tests.db.test_ingest import claim_record

pytestmark = pytest.mark.django_db
T0 = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)


def test_pruning_keeps_what_is_younger_than_the_retention_and_every_live_claim(settings):
    settings.CLAIMSCOPE_CLAIM_HISTORY_DAYS = 30
    cluster = ingest.get_or_create_cluster("retention")
    ingest.apply_batch(
        cluster, "ResourceClaim", [Change("upsert", claim_record("old-live", 1))], observed_at=T0
    )
    ingest.apply_batch(
        cluster, "ResourceClaim", [Change("upsert", claim_record("old-gone", 2))], observed_at=T0
    )
    ingest.apply_batch(
        cluster, "ResourceClaim", [Change("delete", claim_record("old-gone", 3))], observed_at=T0
    )
    recent = T0 + timedelta(days=40)
    ingest.apply_batch(
        cluster, "ResourceClaim", [Change("upsert", claim_record("new", 4))], observed_at=recent
    )
    for uid, seen in (("uid-old-gone", T0), ("uid-new", recent)):
        PendingCause.objects.create(
            cluster=cluster, uid=uid, namespace="ml", name=uid, category="capacity", summary="-",
            first_seen=seen, last_seen=seen,
        )  # fmt: skip

    counts = prune_claim_history(now=(recent + timedelta(days=1)).isoformat())

    assert counts == {"changes": 3, "lifecycles": 1, "causes": 1}
    assert set(ClaimLifecycle.objects.values_list("uid", flat=True)) == {"uid-old-live", "uid-new"}
    assert list(ClaimStateChange.objects.values_list("uid", flat=True)) == ["uid-new"]
    assert list(PendingCause.objects.values_list("uid", flat=True)) == ["uid-new"]
