"""The shapes of the fleet endpoints' rows, for the OpenAPI schema.

Rows are built from ``values()`` (see ``fleet.api.base``); these serializers describe them exactly (types,
nullability), and schemathesis checks every response against them.
"""

from __future__ import annotations

from rest_framework import serializers as s

from fleet.counts import LEGEND
from fleet.models import AllocationSample, Device, WatchCursor


class ClusterRow(s.Serializer):
    id = s.IntegerField()
    name = s.CharField()
    description = s.CharField(allow_blank=True)
    created_at = s.DateTimeField()


class StreamRow(s.Serializer):
    id = s.IntegerField()
    cluster = s.CharField()
    kind = s.CharField()
    resource_version = s.CharField(help_text="Integer of up to 128 bits, as a string")
    state = s.ChoiceField(choices=WatchCursor.STATES, help_text="The state a worker last wrote")
    status = s.ChoiceField(
        choices=[*WatchCursor.STATES, ("stale", "stale")],
        help_text="The state now: stale when no worker has reported within the lease, else state",
    )
    object_count = s.IntegerField()
    relists = s.IntegerField(help_text="Lists that replaced the stream position (the first list is not one)")
    last_event_at = s.DateTimeField(allow_null=True)
    last_error = s.CharField(allow_blank=True)
    last_error_at = s.DateTimeField(allow_null=True)
    updated_at = s.DateTimeField()
    lease_until = s.DateTimeField(allow_null=True, help_text="Until when a worker vouches for the stream")


class KubeRow(s.Serializer):
    id = s.IntegerField()
    cluster = s.CharField()
    uid = s.CharField()
    name = s.CharField()
    created_at = s.DateTimeField(allow_null=True)


class NodeRow(KubeRow):
    ready = s.BooleanField()
    unschedulable = s.BooleanField()
    gpu_product = s.CharField(allow_blank=True)
    clique = s.CharField(allow_blank=True)
    labels = s.DictField(child=s.CharField(allow_blank=True))


class DeviceClassRow(KubeRow):
    selectors = s.ListField(child=s.CharField(allow_blank=True))
    extended_resource_name = s.CharField(allow_blank=True)


class SliceRow(KubeRow):
    driver = s.CharField()
    pool = s.CharField()
    pool_generation = s.IntegerField()
    pool_slice_count = s.IntegerField()
    node_name = s.CharField(allow_blank=True)
    all_nodes = s.BooleanField()
    per_device_node_selection = s.BooleanField()
    device_count = s.IntegerField()
    current = s.BooleanField(help_text="Of its pool's highest generation (older ones do not count)")


class DeviceRow(s.Serializer):
    id = s.IntegerField()
    cluster = s.CharField()
    driver = s.CharField()
    pool = s.CharField()
    name = s.CharField()
    slice_name = s.CharField()
    pool_generation = s.IntegerField()
    node_name = s.CharField(allow_blank=True)
    kind = s.ChoiceField(choices=Device.KINDS)
    model = s.CharField(help_text="Model family: B200, H100, ...")
    product_name = s.CharField(allow_blank=True)
    uuid = s.CharField(allow_blank=True)
    parent_uuid = s.CharField(allow_blank=True)
    gpu_uuid = s.CharField(allow_blank=True, help_text="The physical GPU (own uuid or MIG parent's)")
    gpu_minor = s.IntegerField(allow_null=True)
    mig_profile = s.CharField(allow_blank=True)
    compute_slices = s.IntegerField()
    memory_bytes = s.IntegerField(allow_null=True)
    tainted = s.BooleanField()
    taints = s.ListField(child=s.DictField())
    allocated = s.BooleanField(help_text="Named in a claim's allocation results (adminAccess excluded)")
    claim = s.CharField(allow_null=True, help_text="namespace/name of the claim holding it")


class DeviceDetail(DeviceRow):
    attributes = s.DictField()
    capacity = s.DictField()
    counters_consumed = s.ListField(child=s.DictField())


class MigDeviceRow(s.Serializer):
    id = s.IntegerField()
    name = s.CharField()
    mig_profile = s.CharField(allow_blank=True)
    compute_slices = s.IntegerField()
    allocated = s.BooleanField()


class GpuRow(s.Serializer):
    cluster = s.CharField()
    gpu_uuid = s.CharField()
    model = s.CharField()
    product_name = s.CharField(allow_blank=True)
    node_name = s.CharField(allow_blank=True)
    gpu_minor = s.IntegerField(allow_null=True)
    mig_devices = s.IntegerField()
    tainted_devices = s.IntegerField()
    allocated_slices = s.IntegerField(help_text="Allocated compute slices (a full-GPU allocation is 7)")
    allocated_fraction = s.FloatField(help_text="min(allocated_slices, 7) / 7")
    mig = MigDeviceRow(many=True)


class GroupCountRow(s.Serializer):
    model = s.CharField()
    kind = s.CharField()
    profile = s.CharField(allow_blank=True)
    total = s.IntegerField(help_text=LEGEND["total"])
    allocated = s.IntegerField(help_text=LEGEND["allocated"])
    reserved = s.IntegerField(help_text=LEGEND["reserved"] + " Included in allocated.")
    unavailable = s.IntegerField(help_text=LEGEND["unavailable"])
    tainted = s.IntegerField(help_text=LEGEND["tainted"])
    free = s.IntegerField(help_text=LEGEND["free"] + " total = free + allocated + unavailable.")
    memory_bytes = s.IntegerField()


class ModelTotalsRow(s.Serializer):
    model = s.CharField()
    gpus = s.IntegerField(help_text=LEGEND["gpus"])
    gpus_full = s.IntegerField(help_text=LEGEND["gpus_full"])
    gpus_mig = s.IntegerField(help_text="GPUs carrying MIG devices, static or dynamic.")
    gpus_static_mig = s.IntegerField(help_text=LEGEND["gpus_static_mig"])
    gpus_dynamic = s.IntegerField(help_text=LEGEND["gpus_dynamic"])
    gpus_whole_allocated = s.IntegerField(help_text=LEGEND["gpus_whole_allocated"])
    gpus_tainted = s.IntegerField(help_text=LEGEND["gpus_tainted"])
    compute_slices = s.IntegerField()
    compute_slices_allocated = s.IntegerField(help_text=LEGEND["compute_slices"])
    allocated_fraction = s.FloatField()


class FleetSummaryRow(s.Serializer):
    groups = GroupCountRow(many=True)
    models = ModelTotalsRow(many=True)
    devices = s.IntegerField()
    allocated = s.IntegerField()


class ClusterSummaryRow(FleetSummaryRow):
    cluster = s.CharField()


class SummaryResponse(s.Serializer):
    clusters = ClusterSummaryRow(many=True)
    total = FleetSummaryRow()


class HeatmapResponse(s.Serializer):
    filters = s.DictField(child=s.CharField(allow_blank=True))
    summary = s.DictField(child=s.IntegerField())
    rows = s.DictField(child=s.ListField(), help_text="cluster/node -> [cluster, node, model, pool, cells]")


class SampleRow(s.Serializer):
    id = s.IntegerField()
    time = s.DateTimeField()
    cluster = s.CharField()
    model = s.CharField()
    profile = s.CharField(allow_blank=True, help_text="Empty: the model's GPUs in compute slices")
    resolution = s.ChoiceField(choices=AllocationSample.RESOLUTIONS)
    total = s.FloatField()
    allocated = s.FloatField()
