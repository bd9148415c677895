"""Project-level pages: the home page and the health check."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from fleet import counts, overview, selectors


def home(request: HttpRequest) -> HttpResponse:
    summary = selectors.fleet_summary()
    context = {"summary": summary, "groups": overview.group_rows(summary), "legend": counts.LEGEND}
    return render(request, "home.html", context)


@login_not_required
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness + database reachability; the only page without authentication."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
    except Exception as exc:  # report, don't raise: probes want a status, not a traceback
        return JsonResponse({"status": "error", "database": type(exc).__name__}, status=503)
    return JsonResponse({"status": "ok"})
