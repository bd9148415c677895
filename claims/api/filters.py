"""django-filter FilterSets of the claim endpoints. A bad value is a 400 naming the parameter."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import rest_framework as filters

from claims.api import selectors as api_selectors
from fleet.api.base import DurationFilter, MinAgeFilter
from fleet.api.filters import KubeFilter
from fleet.models import Pod, ResourceClaim, SchedulingEvent


class NamespacedFilter(KubeFilter):
    namespace = filters.CharFilter()


class ClaimFilter(NamespacedFilter):
    state = filters.ChoiceFilter(choices=ResourceClaim.STATES)
    node = filters.CharFilter(field_name="node_name")
    model = filters.CharFilter(method="filter_device", help_text="Holding a device of this model family")
    profile = filters.CharFilter(method="filter_device", help_text="Holding a MIG device of this profile")

    class Meta:
        model = ResourceClaim
        fields: list[str] = []

    def filter_device(self, queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
        return api_selectors.with_model(queryset, "model" if name == "model" else "mig_profile", value)


class LeakFilter(ClaimFilter):
    older_than = DurationFilter(
        method="filter_older_than",
        help_text="Allocated, unreserved for at least this long (default 1h: CLAIMSCOPE_LEAK_AFTER_SECONDS)",
    )

    class Meta:
        model = ResourceClaim
        fields: list[str] = []

    def filter_older_than(self, queryset: QuerySet[Any], name: str, value: Any) -> QuerySet[Any]:
        return queryset  # applied in filter_queryset: the threshold has a default

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        queryset = api_selectors.leaks(queryset, self.form.cleaned_data.get("older_than"))
        return super().filter_queryset(queryset)


class PodFilter(NamespacedFilter):
    node = filters.CharFilter(field_name="node_name")
    phase = filters.CharFilter()
    scheduled = filters.CharFilter(field_name="scheduled_status", help_text="PodScheduled status: True/False")

    class Meta:
        model = Pod
        fields: list[str] = []


class EventFilter(NamespacedFilter):
    reason = filters.CharFilter()
    type = filters.CharFilter()
    involved = filters.CharFilter(field_name="involved_name", help_text="Name of the object concerned")
    age = MinAgeFilter(field_name="last_at", help_text="Last seen at least this long ago: 90, 15m, 2h, 3d")

    class Meta:
        model = SchedulingEvent
        fields: list[str] = []
