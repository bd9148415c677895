"""Fleet pages: overview, heatmap, MIG slots, node/GPU/device/claim detail, cluster status."""

from typing import Any

from django.urls import path

from fleet import views

app_name = "fleet"
urlpatterns: list[Any] = [
    path("", views.fleet_overview, name="overview"),
    path("heatmap/", views.heatmap_page, name="heatmap"),
    path("heatmap.json", views.heatmap_json, name="heatmap-json"),
    path("mig/", views.mig_page, name="mig"),
    path("c/<slug:cluster>/", views.cluster_detail, name="cluster"),
    path("c/<slug:cluster>/nodes/<str:node>/", views.node_detail, name="node"),
    path("c/<slug:cluster>/nodes/<str:node>/gpus/<int:index>/", views.gpu_detail, name="gpu"),
    path("c/<slug:cluster>/nodes/<str:node>/gpus/<int:index>/card/", views.gpu_card, name="gpu-card"),
    path("c/<slug:cluster>/device/", views.device_detail, name="device"),
    path("c/<slug:cluster>/claims/<str:namespace>/<str:name>/", views.claim_detail, name="claim"),
]
