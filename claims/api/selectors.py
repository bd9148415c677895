"""Read queries behind the claim endpoints of the REST API: claims with their devices, pending claims with
their pod's scheduler message, and suspected leaks (allocated, reserved by nobody, for too long)."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import DateTimeField, Exists, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from fleet.models import DeviceAllocation, Pod, ResourceClaim

DEFAULT_LEAK_AFTER = timedelta(hours=1)


def leak_after() -> timedelta:
    """How long a claim may stay allocated with no consumer before it is a suspected leak."""
    seconds = getattr(settings, "CLAIMSCOPE_LEAK_AFTER_SECONDS", None)
    return timedelta(seconds=seconds) if seconds else DEFAULT_LEAK_AFTER


def claims() -> QuerySet[ResourceClaim]:
    """Claims with ``since``: when they were allocated (their creation when the API server did not say)."""
    return ResourceClaim.objects.annotate(
        since=Coalesce("allocated_at", "created_at", output_field=DateTimeField())
    )


def with_model(queryset: QuerySet[ResourceClaim], field: str, value: str) -> QuerySet[ResourceClaim]:
    """Claims holding at least one device whose ``field`` (model, mig_profile) is ``value``."""
    holding = DeviceAllocation.objects.filter(
        cluster_id=OuterRef("cluster_id"),
        claim_uid=OuterRef("uid"),
        admin_access=False,
        **{f"device__{field}": value},
    )
    return queryset.filter(Exists(holding))


def attach_devices(rows: list[dict[str, Any]]) -> None:
    """Add each claim row's allocated devices (``driver/pool/device``), in one query for the page."""
    uids = {r["uid"] for r in rows}
    by_claim: dict[tuple[int, str], list[str]] = defaultdict(list)
    if uids:
        allocations = DeviceAllocation.objects.filter(
            claim_uid__in=uids, cluster_id__in={r["cluster_id"] for r in rows}
        ).order_by("request", "driver", "pool", "device_name")
        for cid, uid, driver, pool, device in allocations.values_list(
            "cluster_id", "claim_uid", "driver", "pool", "device_name"
        ):
            by_claim[(cid, uid)].append(f"{driver}/{pool}/{device}")
    for r in rows:
        r["devices"] = by_claim.get((r["cluster_id"], r["uid"]), [])


def pending() -> QuerySet[ResourceClaim]:
    """Pending claims with their owner pod's PodScheduled condition (the scheduler's message)."""
    pod = Pod.objects.filter(cluster_id=OuterRef("cluster_id"), uid=OuterRef("owner_pod_uid"))
    return ResourceClaim.objects.filter(state="pending").annotate(
        pod_phase=Subquery(pod.values("phase")[:1]),
        scheduler_reason=Subquery(pod.values("scheduled_reason")[:1]),
        scheduler_message=Subquery(pod.values("scheduled_message")[:1]),
    )


def leaks(
    queryset: QuerySet[ResourceClaim] | None = None, older_than: timedelta | None = None
) -> QuerySet[ResourceClaim]:
    """Claims allocated and reserved for no consumer since longer than ``older_than``: suspected leaks.

    Precondition: ``queryset`` comes from :func:`claims` (it has ``since``)."""
    cutoff = timezone.now() - (older_than if older_than is not None else leak_after())
    queryset = queryset if queryset is not None else claims()
    return queryset.filter(state="allocated", since__lte=cutoff)  # type: ignore[misc]
