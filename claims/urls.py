"""Claim pages: pending claims, diagnosis, triage."""

from typing import Any

from django.urls import path

from claims import views
from claims.triage import views as triage_views

app_name = "claims"
urlpatterns: list[Any] = [
    path("pending/", views.pending_page, name="pending"),
    path("pending/fragment/", views.pending_fragment, name="pending-fragment"),
    path("c/<slug:cluster>/<str:namespace>/<str:name>/diagnosis/", views.claim_diagnosis, name="diagnosis"),
    path("triage/", triage_views.triage_page, name="triage"),
]
