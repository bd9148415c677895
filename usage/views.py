"""Utilization pages: ``/usage/idle/`` (idle allocations). Login is required by the middleware.

Thin: the report comes from ``usage.report.idle_report`` (the same data as the API and ``manage.py idle``).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from dashboard.visibility import visibility_for
from fleet.models import Cluster
from usage.report import WindowError, idle_report


def _param(request: HttpRequest, name: str) -> str | None:
    value = request.GET.get(name, "").replace("\x00", "").strip()
    return value or None


def idle_page(request: HttpRequest) -> HttpResponse:
    vis = visibility_for(request.user)
    query = {name: _param(request, name) or "" for name in ("since", "until", "below", "cluster")}
    try:
        report = idle_report(
            query["since"] or None,
            query["until"] or None,
            query["below"] or None,
            query["cluster"] or None,
            vis.q(),
        )
    except WindowError as exc:
        return HttpResponseBadRequest(f"{exc.parameter}: {exc.message}", content_type="text/plain")
    context = {
        "report": report,
        "query": query,
        "cluster_choices": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
    }
    return render(request, "usage/idle.html", context)
