"""Utilization pages: ``/usage/idle/`` (idle allocations) and ``/usage/gpus.json`` (the heatmap's
utilization mode). Login is required by the middleware.

Thin: the report comes from ``usage.report.idle_report`` (the same data as the API and ``manage.py idle``).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from dashboard.renderers import dumps
from dashboard.visibility import visibility_for
from fleet.models import Cluster
from usage import cells, selectors
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


def gpus_json(request: HttpRequest) -> HttpResponse:
    """Utilization per physical GPU for the heatmap's utilization mode (``usage.cells``), with the idle
    threshold and since when utilization has been unavailable. Device values are fleet-wide, like the
    heatmap's allocation counts: no claim is named."""
    clusters = list(Cluster.objects.order_by("name").values_list("pk", flat=True))
    rows, times = cells.load(clusters)
    for cid in clusters:
        if cid not in times:
            rows.update(cells.from_database(cid))  # a flushed cache: rebuilt from the last round's rows
    body = {
        "rows": rows,
        "sampled_at": max(times.values()) if times else None,
        "unavailable_since": selectors.unavailable_since(),
        "below_percent": settings.CLAIMSCOPE_IDLE_BELOW_PERCENT,
        "idle_window_minutes": settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES,
    }
    return HttpResponse(dumps(body), content_type="application/json")
