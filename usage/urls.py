"""Utilization pages."""

from typing import Any

from django.urls import path

from usage import views

app_name = "usage"
urlpatterns: list[Any] = [
    path("idle/", views.idle_page, name="idle"),
    path("gpus.json", views.gpus_json, name="gpus"),
    path("series.json", views.series_json, name="series"),
    path("trends/", views.trends_page, name="trends"),
]
