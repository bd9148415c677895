"""Fleet endpoints of the REST API (/api/v1/): clusters, streams, nodes, devices, GPUs, slices, device
classes, heatmap, summary and allocation history. Read-only; the rules live in selectors."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import feed, heatmap
from fleet.access.visibility import redact_heatmap_rows, visibility_for
from fleet.api import filters as api_filters
from fleet.api import selectors as api_selectors
from fleet.api import serializers as rows
from fleet.api.base import StrictContentNegotiation, ValuesListViewSet, ValuesViewSet, reject_empty
from fleet.filters import PARAMETERS, STATES, FilterError, parse_filters
from fleet.models import (
    AllocationSample,
    Cluster,
    Device,
    DeviceClass,
    GpuState,
    Node,
    WatchCursor,
    stream_status,
)
from web.renderers import ORJSONRenderer

# The FleetFilter rules (fleet/filters.py) as schema patterns, so clients (and fuzzers) know them.
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
HEATMAP_PATTERNS = {
    "cluster": _NAME,
    "model": _NAME,
    "pool": _NAME,
    "label": r"^([A-Za-z0-9][A-Za-z0-9.-]{0,252}/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
    r"(=(([A-Za-z0-9][A-Za-z0-9._-]{0,61})?[A-Za-z0-9])?)?$",
}
KUBE_FIELDS = ("id", "cluster__name", "uid", "name", "created_at")
CLUSTER = {"cluster__name": "cluster"}


class ClusterViewSet(ValuesViewSet):
    """Clusters whose objects claimscope mirrors."""

    queryset = Cluster.objects.all()
    serializer_class = rows.ClusterRow
    filterset_class = api_filters.ClusterFilter
    fields = ("id", "name", "description", "created_at")
    ordering = ("name", "id")
    ordering_fields = ("id", "name")


class StreamViewSet(ValuesViewSet):
    """Watch streams, one per (cluster, kind): resourceVersion, state, last event and last error.

    ``status`` is the state as it is now: ``stale`` when no worker has vouched for the stream within its
    lease (``lease_until`` passed), else ``state``, the one a worker last wrote."""

    queryset = WatchCursor.objects.all()
    serializer_class = rows.StreamRow
    filterset_class = api_filters.StreamFilter
    fields = (
        "id", "cluster__name", "kind", "resource_version", "state", "object_count",
        "relists", "last_event_at", "last_error", "last_error_at", "updated_at", "lease_until",
    )  # fmt: skip
    renames = CLUSTER
    ordering_fields = ("id", "kind", "state")

    def decorate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now = timezone.now()
        for row in rows:
            row["status"] = stream_status(row["state"], row["lease_until"], now)
        return rows


class NodeViewSet(ValuesViewSet):
    """Kubernetes nodes with their GPU product and NVLink clique labels."""

    queryset = Node.objects.all()
    serializer_class = rows.NodeRow
    filterset_class = api_filters.NodeFilter
    fields = (*KUBE_FIELDS, "ready", "unschedulable", "gpu_product", "clique", "labels")
    renames = CLUSTER
    ordering = ("name", "id")
    ordering_fields = ("id", "name", "gpu_product")


class DeviceClassViewSet(ValuesViewSet):
    """DeviceClasses and the CEL selectors every request naming them must pass."""

    queryset = DeviceClass.objects.all()
    serializer_class = rows.DeviceClassRow
    filterset_class = api_filters.KubeFilter
    fields = (*KUBE_FIELDS, "selectors", "extended_resource_name")
    renames = CLUSTER
    ordering = ("name", "id")
    ordering_fields = ("id", "name")


class SliceViewSet(ValuesViewSet):
    """ResourceSlices; ``current`` is false for slices of an older pool generation (they do not count)."""

    serializer_class = rows.SliceRow
    filterset_class = api_filters.SliceFilter
    fields = (
        *KUBE_FIELDS, "driver", "pool", "pool_generation", "pool_slice_count", "node_name", "all_nodes",
        "per_device_node_selection", "device_count", "current",
    )  # fmt: skip
    renames = CLUSTER
    ordering = ("name", "id")
    ordering_fields = ("id", "name", "pool", "node_name")

    def get_queryset(self) -> QuerySet[Any]:
        return api_selectors.slices()


class DeviceViewSet(ValuesViewSet):
    """Devices of each pool's current generation, with the claim each is allocated to.

    The list leaves out the bulky ``attributes``, ``capacity`` and ``counters_consumed``; a device's own
    page has them."""

    filterset_class = api_filters.DeviceFilter
    fields = (
        "id", "cluster__name", "driver", "pool", "name", "slice_name", "pool_generation", "node_name", "kind",
        "model", "product_name", "uuid", "parent_uuid", "gpu_uuid", "gpu_minor", "mig_profile",
        "compute_slices", "memory_bytes", "tainted", "taints", "cluster_id", "claim_uid",
    )  # fmt: skip
    detail_fields = ("attributes", "capacity", "counters_consumed")
    renames = CLUSTER
    ordering_fields = ("id", "name", "node_name", "model")

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no database queries
            return Device.objects.none()
        return api_selectors.current_devices()

    def get_serializer_class(self) -> Any:
        return rows.DeviceDetail if self.action == "retrieve" else rows.DeviceRow

    def values(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        extra = self.detail_fields if self.action == "retrieve" else ()
        return queryset.values(*self.fields, *extra)

    def decorate(self, page: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = api_selectors.claim_names({(r["cluster_id"], r["claim_uid"]) for r in page if r["claim_uid"]})
        vis = visibility_for(self.request.user)
        for r in page:
            uid = r.pop("claim_uid")
            cid = r.pop("cluster_id")
            r["allocated"] = uid is not None
            r["claim"] = names.get((cid, uid), uid) if uid is not None else None
            # A claim in a namespace the user may not see: the device stays allocated, the claim unnamed.
            if r["claim"] is not None and vis.restricted:
                known = (cid, uid) in names
                if not known or not vis.allows(r["cluster__name"], r["claim"].split("/", 1)[0]):
                    r["claim"] = None
        return page


class GpuViewSet(ValuesListViewSet):
    """Physical GPUs (a full-GPU device, or the parent of MIG devices) with their MIG devices and the
    allocated share of their compute slices."""

    serializer_class = rows.GpuRow
    filterset_class = api_filters.GpuFilter
    fields = ()
    renames = {
        "gpu_model": "model",
        "gpu_product": "product_name",
        "gpu_node": "node_name",
        "gpu_index": "gpu_minor",
    }
    ordering = ("gpu_uuid", "cluster_id")
    ordering_fields = ("gpu_uuid",)
    tiebreak = "cluster_id"

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no database queries
            return GpuState.objects.none()
        return api_selectors.gpus()

    def values(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset

    def decorate(self, page: list[dict[str, Any]]) -> list[dict[str, Any]]:
        api_selectors.attach_mig_devices(page)
        names = api_selectors.cluster_names()
        for r in page:
            r["cluster"] = names.get(r.pop("cluster_id"), "")
        return page


class HistoryViewSet(ValuesListViewSet):
    """Allocation over time per (cluster, model, MIG profile): a point a minute for 30 days, then hourly
    averages for a year. ``profile`` is empty for a model's GPUs (in compute slices, 7 per GPU)."""

    queryset = AllocationSample.objects.all()
    serializer_class = rows.SampleRow
    filterset_class = api_filters.SampleFilter
    fields = ("id", "time", "cluster__name", "model", "profile", "resolution", "total", "allocated")
    renames = CLUSTER
    ordering = ("time", "id")
    ordering_fields = ("id", "time")


def _fleet_filters(request: Request) -> Any:
    try:
        return parse_filters(request.query_params)
    except FilterError as exc:
        raise exceptions.ValidationError({exc.parameter: [str(exc)]}) from None


class HeatmapView(APIView):
    """The heatmap matrix, the same rows as the websocket snapshot: rows keyed ``cluster/node`` holding
    ``[cluster, node, model, pool, cells]``; a cell is ``[gpu index, allocated compute slices (0..7),
    flags (1 tainted, 2 unavailable, 4 reserved, 8 unreserved), MIG layout, number of claims]``."""

    renderer_classes = [ORJSONRenderer]
    content_negotiation_class = StrictContentNegotiation

    @extend_schema(
        parameters=[
            OpenApiParameter(
                name, OpenApiTypes.STR, required=False, pattern=HEATMAP_PATTERNS.get(name), enum=enum
            )
            for name, enum in ((p, STATES if p == "state" else None) for p in PARAMETERS)
        ],
        responses=rows.HeatmapResponse,
    )
    def get(self, request: Request) -> Response:
        reject_empty(request, PARAMETERS)
        filters = _fleet_filters(request)
        matrix = redact_heatmap_rows(feed.load_rows(filters), visibility_for(request.user))
        return Response({"filters": filters.as_dict(), "summary": heatmap.summary(matrix), "rows": matrix})


class SummaryView(APIView):
    """Partition-aware device counts per cluster and fleet-wide: by model, kind and MIG profile, and by
    state (allocated, unavailable, tainted, free); physical GPUs per model with their compute slices."""

    renderer_classes = [ORJSONRenderer]
    content_negotiation_class = StrictContentNegotiation

    @extend_schema(
        parameters=[
            OpenApiParameter("cluster", OpenApiTypes.STR, required=False, description="Cluster name")
        ],
        responses=rows.SummaryResponse,
    )
    def get(self, request: Request) -> Response:
        reject_empty(request, ["cluster"])
        name = request.query_params.get("cluster")
        if name is None:
            return Response(api_selectors.compute_summary())
        # Like the list filters: an unknown cluster has nothing in it (no devices), not an error.
        cluster_id = (
            Cluster.objects.filter(name=name.replace("\x00", "")).values_list("id", flat=True).first()
        )
        return Response(api_selectors.compute_summary(cluster_id if cluster_id is not None else -1))
