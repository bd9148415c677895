"""django-filter FilterSets of the fleet endpoints. A bad value is a 400 naming the parameter."""

from __future__ import annotations

from django_filters import rest_framework as filters

from fleet.api.base import BooleanFilter, MinAgeFilter, UtcDateTimeFilter
from fleet.models import AllocationSample, Device, GpuState, Node, ResourceSlice, WatchCursor


class ClusterFilter(filters.FilterSet):
    name = filters.CharFilter(help_text="Cluster name")


class ClusterScoped(filters.FilterSet):
    cluster = filters.CharFilter(field_name="cluster__name", help_text="Cluster name")


class KubeFilter(ClusterScoped):
    name = filters.CharFilter(help_text="Object name")
    age = MinAgeFilter(field_name="created_at", help_text="Minimum age: 90 (seconds), 15m, 2h, 3d, 1w")


class StreamFilter(ClusterScoped):
    kind = filters.CharFilter()
    state = filters.ChoiceFilter(choices=WatchCursor.STATES)

    class Meta:
        model = WatchCursor
        fields: list[str] = []


class NodeFilter(KubeFilter):
    model = filters.CharFilter(field_name="gpu_product", lookup_expr="icontains", help_text="GPU product")
    ready = BooleanFilter()

    class Meta:
        model = Node
        fields: list[str] = []


class SliceFilter(KubeFilter):
    driver = filters.CharFilter()
    pool = filters.CharFilter()
    node = filters.CharFilter(field_name="node_name")

    class Meta:
        model = ResourceSlice
        fields: list[str] = []


class DeviceFilter(ClusterScoped):
    model = filters.CharFilter(help_text="Model family: B200, H100, ...")
    profile = filters.CharFilter(field_name="mig_profile", help_text="MIG profile, e.g. 1g.10gb")
    kind = filters.ChoiceFilter(choices=Device.KINDS)
    node = filters.CharFilter(field_name="node_name")
    driver = filters.CharFilter()
    pool = filters.CharFilter()
    gpu = filters.CharFilter(field_name="gpu_uuid", help_text="Physical GPU uuid")
    tainted = BooleanFilter()
    state = filters.ChoiceFilter(
        choices=[("allocated", "allocated"), ("free", "free")],
        method="filter_state",
        help_text="allocated: named in a claim's allocation results; free: not allocated",
    )

    class Meta:
        model = Device
        fields: list[str] = []

    def filter_state(self, queryset, name, value):  # type: ignore[no-untyped-def]
        return queryset.filter(claim_uid__isnull=value != "allocated")


class GpuFilter(filters.FilterSet):
    cluster = filters.CharFilter(field_name="cluster__name", help_text="Cluster name")
    model = filters.CharFilter(help_text="Model family: B200, H100, ...")
    node = filters.CharFilter(field_name="node_name")
    profile = filters.CharFilter(
        method="filter_profile", help_text="GPUs carrying at least one MIG device of this profile"
    )

    class Meta:
        model = GpuState
        fields: list[str] = []

    def filter_profile(self, queryset, name, value):  # type: ignore[no-untyped-def]
        carriers = Device.objects.filter(mig_profile=value).values("gpu_uuid")
        return queryset.filter(gpu_uuid__in=carriers)


class SampleFilter(ClusterScoped):
    def filter_profile(self, queryset, name, value):  # type: ignore[no-untyped-def]
        return queryset.filter(profile="" if value == "gpu" else value)

    model = filters.CharFilter()
    profile = filters.CharFilter(
        method="filter_profile", help_text="A MIG profile, or 'gpu' for the model's GPUs (in compute slices)"
    )
    resolution = filters.ChoiceFilter(choices=AllocationSample.RESOLUTIONS)
    since = UtcDateTimeFilter(field_name="time", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="time", lookup_expr="lt")

    class Meta:
        model = AllocationSample
        fields: list[str] = []
