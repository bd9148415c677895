"""Utilization pages: ``/usage/idle/`` (idle allocations), ``/usage/gpus.json`` (the heatmap's
utilization mode) and ``/usage/series.json`` (24-hour charts on GPU, node and claim pages). Login is
required by the middleware.

Thin: the report comes from ``usage.report.idle_report`` (the same data as the API and ``manage.py idle``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.utils import timezone

from fleet.access.visibility import visibility_for
from fleet.models import Cluster, Device
from usage import cells, charts, sampler, selectors
from usage.models import SamplingState
from usage.prometheus import PrometheusSource, PrometheusUnavailable
from usage.report import WindowError, idle_report
from usage.trends import GROUPS, trend_rows
from web.renderers import dumps


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


def series_json(request: HttpRequest) -> HttpResponse:
    """The last 24 hours of utilization for a GPU (``cluster``, ``node``, ``index``), a node (``cluster``,
    ``node``) or a claim (``cluster``, ``namespace``, ``claim``), from the cluster's Prometheus."""
    params = {k: _param(request, k) or "" for k in ("cluster", "node", "index", "namespace", "claim")}
    config = settings.CLAIMSCOPE_PROMETHEUS.get(params["cluster"])
    body: dict[str, Any] = {"activity": [], "memory": [], "unavailable": None}
    if config is None:
        body["unavailable"] = (
            f"no Prometheus configured for cluster {params['cluster']!r} (CLAIMSCOPE_PROMETHEUS): charts "
            "come from Prometheus's history; `make demo-stack` runs the demo with one"
        )
        return HttpResponse(dumps(body), content_type="application/json")
    cluster = Cluster.objects.filter(name=params["cluster"]).first()
    if cluster is None:
        raise Http404("no such cluster")
    source = PrometheusSource(config)
    selector: str | list[str]
    if params["claim"]:
        if not visibility_for(request.user).allows(cluster.name, params["namespace"]):
            raise Http404("no such claim")
        selector = []  # found with Prometheus's answer, below
    elif params["node"]:
        devices = Device.objects.filter(cluster=cluster, node_name=params["node"])
        if params["index"]:
            if not params["index"].isdigit():
                return HttpResponseBadRequest("index: a GPU index (0, 1, ...)", content_type="text/plain")
            devices = devices.filter(gpu_minor=int(params["index"]))
        selector = charts.matchers(config, {}, list(devices.values_list("gpu_uuid", flat=True)))
    else:
        return HttpResponseBadRequest(
            "name a node (node, index) or a claim (namespace, claim)", content_type="text/plain"
        )
    try:
        if params["claim"]:
            instances = sampler.claim_instances(cluster.pk, params["namespace"], params["claim"], source)
            selector = charts.claim_matchers(config, params["namespace"], params["claim"], instances)
        traces = charts.traces(source, selector, timezone.now())
    except PrometheusUnavailable as exc:
        state = SamplingState.objects.filter(cluster=cluster).first()
        since = state.unavailable_since if state and state.unavailable_since else timezone.now()
        body["unavailable"] = f"utilization unavailable since {since:%Y-%m-%d %H:%M} UTC ({exc})"
        return HttpResponse(dumps(body), content_type="application/json")
    body["activity"], body["memory"] = traces.activity, traces.memory
    return HttpResponse(dumps(body), content_type="application/json")


def trends_page(request: HttpRequest) -> HttpResponse:
    """Allocation against utilization per model over a window (default 24 h), charted from the API's data."""
    query = {name: _param(request, name) or "" for name in ("since", "until", "cluster", "group")}
    try:
        data = trend_rows(
            query["since"] or None, query["until"] or None, query["cluster"] or None, query["group"] or None
        )
    except WindowError as exc:
        return HttpResponseBadRequest(f"{exc.parameter}: {exc.message}", content_type="text/plain")
    context = {
        "data": data,
        "query": query,
        "groups": list(GROUPS),
        "cluster_choices": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
    }
    return render(request, "usage/trends.html", context)
