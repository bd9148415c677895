"""Claim endpoints of the REST API (/api/v1/): claims, pods, events, pending claims and suspected leaks."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from claims.api import filters as api_filters
from claims.api import selectors as api_selectors
from claims.api import serializers as rows
from claims.shaped import put_names
from fleet.access.visibility import redact_text, visibility_for
from fleet.api.base import ValuesListViewSet, ValuesViewSet
from fleet.models import Pod, SchedulingEvent

NAMESPACED = ("id", "cluster__name", "cluster_id", "uid", "namespace", "name", "created_at")
CLUSTER = {"cluster__name": "cluster"}
CLAIM_FIELDS = (
    *NAMESPACED, "state", "requests", "constraints", "reserved_for", "node_name", "owner_pod_name",
    "allocated_at", "since",
)  # fmt: skip


def visible(request: Any, queryset: QuerySet[Any]) -> QuerySet[Any]:
    """Only rows in namespaces the user may see (fleet.access.visibility): lists, CSV and pages alike."""
    return queryset.filter(visibility_for(request.user).q())


class NamespacedViewSet(ValuesViewSet):
    renames = CLUSTER
    ordering = ("name", "id")
    ordering_fields: tuple[str, ...] = ("id", "name", "namespace")
    queryset: QuerySet[Any] | None = None

    def get_queryset(self) -> QuerySet[Any]:
        assert self.queryset is not None, "a namespaced viewset needs a queryset or its own get_queryset"
        return visible(self.request, self.queryset.all())

    def decorate(self, page: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in page:
            del r["cluster_id"]
        return page


class ClaimViewSet(NamespacedViewSet):
    """ResourceClaims with their state and allocated devices (``driver/pool/device``)."""

    serializer_class = rows.ClaimRow
    filterset_class = api_filters.ClaimFilter
    fields = CLAIM_FIELDS
    ordering_fields = ("id", "name", "namespace", "state")

    def get_queryset(self) -> QuerySet[Any]:
        return visible(self.request, api_selectors.claims())

    def decorate(self, page: list[dict[str, Any]]) -> list[dict[str, Any]]:
        api_selectors.attach_devices(page)
        return super().decorate(page)


class LeakViewSet(ValuesListViewSet):
    """Suspected leaks: claims allocated and reserved for no consumer for longer than ``older_than``
    (default: the CLAIMSCOPE_LEAK_AFTER_SECONDS setting, one hour)."""

    serializer_class = rows.ClaimRow
    filterset_class = api_filters.LeakFilter
    fields = CLAIM_FIELDS
    renames = CLUSTER
    ordering = ("name", "id")
    ordering_fields = ("id", "name", "namespace")

    def get_queryset(self) -> QuerySet[Any]:
        return visible(self.request, api_selectors.claims())

    def decorate(self, page: list[dict[str, Any]]) -> list[dict[str, Any]]:
        api_selectors.attach_devices(page)
        for r in page:
            del r["cluster_id"]
        return page


class PendingViewSet(NamespacedViewSet):
    """Pending claims with their pod's scheduler message and their latest diagnosis (category, summary and
    when it was computed; null until the diagnosis task has looked at the claim)."""

    serializer_class = rows.PendingRow
    filterset_class = api_filters.NamespacedFilter
    fields = (
        *NAMESPACED, "requests", "owner_pod_name", "pod_phase", "scheduler_reason", "scheduler_message",
        "diagnosis__shape__category", "diagnosis__shape__summary", "diagnosis__shape__computed_at",
        "diagnosis__shape__named", "diagnosis__pod_name",
    )  # fmt: skip

    def get_queryset(self) -> QuerySet[Any]:
        return visible(self.request, api_selectors.pending())

    def decorate(self, page: list[dict[str, Any]]) -> list[dict[str, Any]]:
        vis = visibility_for(self.request.user)
        for r in page:
            category = r.pop("diagnosis__shape__category")
            named, pod = r.pop("diagnosis__shape__named"), r.pop("diagnosis__pod_name")
            said = put_names(r.pop("diagnosis__shape__summary") or "", r["name"], r["uid"], pod, named=named)
            # The summary names the claims holding the devices wanted: hide those of other namespaces.
            summary = redact_text(said, vis, r["cluster__name"]) if category else None
            computed_at = r.pop("diagnosis__shape__computed_at")
            r["diagnosis"] = (
                None
                if category is None
                else {"category": category, "summary": summary, "computed_at": computed_at}
            )
        return super().decorate(page)


class PodViewSet(NamespacedViewSet):
    """Pods that use resource claims or GPU extended resources, with their PodScheduled condition."""

    queryset = Pod.objects.all()
    serializer_class = rows.PodRow
    filterset_class = api_filters.PodFilter
    fields = (
        *NAMESPACED, "phase", "node_name", "scheduled_status", "scheduled_reason", "scheduled_message",
        "scheduled_at", "claim_refs", "gpu_requests",
    )  # fmt: skip


class EventViewSet(NamespacedViewSet):
    """Kubernetes events that explain stuck pods and claims (FailedScheduling and the like)."""

    queryset = SchedulingEvent.objects.all()
    serializer_class = rows.EventRow
    filterset_class = api_filters.EventFilter
    fields = (
        *NAMESPACED, "reason", "type", "message", "involved_kind", "involved_namespace", "involved_name",
        "involved_uid", "count", "first_at", "last_at",
    )  # fmt: skip
