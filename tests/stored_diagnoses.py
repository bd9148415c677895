"""Stored diagnoses as tests read and tamper with them.

A claim's stored diagnosis is its shape's (``claims.models.DiagnosisShape``), shared with the claims of
the same shape; a test that changes one claim's diagnosis first gives it a shape of its own."""

from __future__ import annotations

from typing import Any

from claims.models import ClaimDiagnosis, DiagnosisShape
from fleet.models import ResourceClaim


def stored_results(**filters: Any) -> dict[int, Any]:
    """Each claim's stored result as it reads it (its own names put back), by claim id."""
    rows = ClaimDiagnosis.objects.filter(**filters).select_related("claim", "shape")
    return {d.claim_id: d.result for d in rows}


def own_shape(claim: ResourceClaim) -> DiagnosisShape:
    """Give ``claim`` a shape of its own holding what it reads now; the claims it shared with keep theirs."""
    d = ClaimDiagnosis.objects.select_related("claim", "shape").get(claim=claim)
    shape = DiagnosisShape.objects.create(
        cluster_id=claim.cluster_id,
        key=f"test-own-{claim.pk}",
        named=False,
        category=d.category,
        summary=d.summary,
        result=d.result,
        group_key=d.group_key,
        computed_at=d.computed_at,
    )
    ClaimDiagnosis.objects.filter(pk=d.pk).update(shape=shape)
    return shape
