"""The REST API under /api/: v1 endpoints, the OpenAPI schema, its docs page and the token page."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import SimpleRouter

from claims.api import diagnosis as diagnosis_api
from claims.api import triage as api_triage
from claims.api import views as claims_api
from fleet.api import tokens as api_tokens
from fleet.api import views as fleet_api
from usage import api as usage_api

app_name = "api"

router = SimpleRouter()
router.register("clusters", fleet_api.ClusterViewSet, basename="cluster")
router.register("streams", fleet_api.StreamViewSet, basename="stream")
router.register("nodes", fleet_api.NodeViewSet, basename="node")
router.register("devices", fleet_api.DeviceViewSet, basename="device")
router.register("gpus", fleet_api.GpuViewSet, basename="gpu")
router.register("slices", fleet_api.SliceViewSet, basename="slice")
router.register("device-classes", fleet_api.DeviceClassViewSet, basename="device-class")
router.register("claims", claims_api.ClaimViewSet, basename="claim")
router.register("pods", claims_api.PodViewSet, basename="pod")
router.register("events", claims_api.EventViewSet, basename="event")
router.register("pending", claims_api.PendingViewSet, basename="pending")
router.register("leaks", claims_api.LeakViewSet, basename="leak")
router.register("history", fleet_api.HistoryViewSet, basename="history")

v1: list[Any] = [
    *diagnosis_api.urlpatterns_v1,  # POST whatif, GET claims/<id>/diagnosis
    *router.urls,
    path("heatmap/", fleet_api.HeatmapView.as_view(), name="heatmap"),
    path("summary/", fleet_api.SummaryView.as_view(), name="summary"),
    path("triage/", api_triage.TriageView.as_view(), name="triage"),
    path("idle/", usage_api.IdleView.as_view(), name="idle"),
    path("usage-trends/", usage_api.UsageTrendsView.as_view(), name="usage-trends"),
]

urlpatterns: list[Any] = [
    path("v1/", include(v1)),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its init script as a file: our CSP allows no inline script.
    path("docs/", login_required(SpectacularSwaggerSplitView.as_view(url_name="api:schema")), name="docs"),
    path("tokens/", api_tokens.tokens_page, name="tokens"),
]
