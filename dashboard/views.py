"""Project-level pages: the home page and the health checks (what they report: dashboard/health.py)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard import health
from fleet import counts, overview, selectors


def home(request: HttpRequest) -> HttpResponse:
    summary = selectors.fleet_summary()
    context = {"summary": summary, "groups": overview.group_rows(summary), "legend": counts.LEGEND}
    return render(request, "home.html", context)


@login_not_required
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: 200 while this process serves, with the report; one of the two pages without login."""
    body, _ = health.report()
    return JsonResponse(body)


@login_not_required
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 503 while the database or Redis is unreachable."""
    body, ready = health.report()
    return JsonResponse(body, status=200 if ready else 503)
