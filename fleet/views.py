"""Fleet pages. Views parse filters, call selectors and the pure builders, and render; no rules here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any

import orjson
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone

from fleet import counts, feed, heatmap, overview, selectors
from fleet.access.visibility import (
    Visibility,
    redact_claim_refs,
    redact_heatmap_rows,
    redact_holders,
    visibility_for,
)
from fleet.filters import PARAMETERS as FILTER_PARAMETERS
from fleet.filters import STATES, FilterError, FleetFilter, parse_filters
from fleet.models import (
    Cluster,
    Device,
    DeviceAllocation,
    Node,
    Pod,
    PodClaimUse,
    ResourceClaim,
    SchedulingEvent,
)

MIG_PAGE_LIMIT = 400  # GPUs drawn on one MIG page; narrow with filters for more
View = Callable[..., HttpResponse]


def _lenient_filters(params: Mapping[str, str]) -> tuple[FleetFilter, dict[str, str]]:
    """The filters without their bad values, and a message per bad parameter."""
    values = {key: params.get(key, "") for key in FILTER_PARAMETERS}
    errors: dict[str, str] = {}
    while True:
        try:
            filters = parse_filters(values)
        except FilterError as exc:
            errors[exc.parameter] = str(exc).removeprefix(f"{exc.parameter}: ")
            values[exc.parameter] = ""
            continue
        if filters.cluster and not Cluster.objects.filter(name=filters.cluster).exists():
            errors["cluster"] = f"no cluster named {filters.cluster!r}"
            values["cluster"] = ""
            continue
        return filters, errors


def with_filters(view: View) -> View:
    """Parse the filter query string. A bad value on a page re-renders it without that filter, the
    message beside its field (HTTP 400); a data view answers a 400 naming the parameter."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        filters, errors = _lenient_filters(request.GET)
        if not errors:
            return view(request, filters, *args, **kwargs)
        if view.__name__.endswith("_json"):
            parameter, problem = next(iter(errors.items()))
            return HttpResponseBadRequest(f"Bad filter {parameter}: {problem}\n", content_type="text/plain")
        request.filter_errors = errors  # type: ignore[attr-defined]  # read by fleet/_filters.html
        response = view(request, filters, *args, **kwargs)
        response.status_code = 400
        return response

    return wrapper


def _clusters(filters: FleetFilter) -> dict[int, str]:
    query = Cluster.objects.all()
    if filters.cluster:
        query = query.filter(name=filters.cluster)
    return dict(query.values_list("id", "name"))


def _choices(filters: FleetFilter) -> dict[str, Any]:
    """What the filter bar offers, and the current filters."""
    return {
        "filters": filters,
        "cluster_choices": list(Cluster.objects.values_list("name", flat=True)),
        # The models the read model counts (current devices): a distinct over every device row took
        # 117 ms of each fleet page at XL (1M devices).
        "model_choices": selectors.gpu_models(),
        "state_choices": STATES,
    }


@with_filters
def fleet_overview(request: HttpRequest, filters: FleetFilter) -> HttpResponse:
    names = _clusters(filters)
    clusters = overview.load_cluster_overviews(filters, names)
    streams = overview.stream_health(selectors.stream_cursors(list(names)), timezone.now())
    context = {
        "clusters": [
            {"name": c.name, "summary": c.summary, "groups": c.groups(filters.state)} for c in clusters
        ],
        "streams": streams,
        "unhealthy_streams": [s for s in streams if not s.healthy],
        "legend": counts.LEGEND,
        **_choices(filters),
    }
    return render(request, "fleet/overview.html", context)


@with_filters
def heatmap_page(request: HttpRequest, filters: FleetFilter) -> HttpResponse:
    config = {"ws": "/ws/fleet/?" + filters.query(), "base": reverse("fleet:overview")}
    context = {"config": config, "legend": counts.LEGEND, **_choices(filters)}
    return render(request, "fleet/heatmap.html", context)


@with_filters
def heatmap_json(request: HttpRequest, filters: FleetFilter) -> HttpResponse:
    """The heatmap rows as JSON (what the websocket snapshot carries), for scripts and the benchmark."""
    rows = redact_heatmap_rows(feed.load_rows(filters), visibility_for(request.user))
    body = {"filters": filters.as_dict(), "summary": heatmap.summary(rows), "rows": rows}
    return HttpResponse(orjson.dumps(body), content_type="application/json")


@with_filters
def mig_page(request: HttpRequest, filters: FleetFilter) -> HttpResponse:
    names = _clusters(filters)
    devices, counter_sets = selectors.heatmap_devices(
        list(names), model=filters.model, pool=filters.pool, extra=("name", "capacity")
    )
    labels = selectors.node_labels(list(names)) if filters.label else {}
    devices = overview.narrow(devices, filters, labels)
    holders = selectors.allocation_holders(list(names))
    gpus = _redact_mig(overview.mig_gpus(devices, holders, counter_sets, names, filters.state), request)
    context = {
        "gpus": gpus[:MIG_PAGE_LIMIT],
        "gpu_count": len(gpus),
        "limited": len(gpus) > MIG_PAGE_LIMIT,
        "fragmentation": overview.fragmentation(gpus),
        "slots": range(7),
        **_choices(filters),
    }
    return render(request, "fleet/mig.html", context)


# ------------------------------------------------------------------------------------------- details


def cluster_detail(request: HttpRequest, cluster: str) -> HttpResponse:
    c = get_object_or_404(Cluster, name=cluster)
    streams = overview.stream_health(selectors.stream_cursors([c.pk]), timezone.now())
    nodes = Node.objects.filter(cluster=c).order_by("name")
    context = {"cluster": c, "streams": streams, "nodes": nodes, "node_count": nodes.count()}
    return render(request, "fleet/cluster.html", context)


def _redact_mig(gpus: list[overview.MigGpu], request: HttpRequest) -> list[overview.MigGpu]:
    """MIG blocks name their claims: foreign ones become "allocated — another namespace"."""
    vis = visibility_for(request.user)
    if vis.restricted:
        for g in gpus:
            for b in g.blocks:
                b.claims = redact_claim_refs(b.claims, vis, g.cluster)
    return gpus


def _visible_holders(
    vis: Visibility, c: Cluster, pools: list[str]
) -> dict[selectors.DeviceKey, list[selectors.Holder]]:
    """Holders of the cluster's devices, foreign claims without their identity (fleet.access.visibility)."""
    holders = selectors.allocation_holders([c.pk], pools=pools, consumers=True)
    return redact_holders(holders, vis, {c.pk: c.name})


def _node_gpus(vis: Visibility, c: Cluster, node: str) -> tuple[heatmap.Rows, list[dict[str, Any]], Any, Any]:
    """The node's heatmap row, devices, holders (foreign ones without identity) and counter sets."""
    devices, counter_sets = selectors.heatmap_devices(
        [c.pk], node=node, extra=("name", "capacity", "uuid", "product_name", "memory_bytes", "taints")
    )
    pools = sorted({d["pool"] for d in devices})
    holders = selectors.allocation_holders([c.pk], pools=pools, consumers=True)
    # Rows count distinct claims per GPU: build them before redaction merges the hidden ones.
    rows = heatmap.build_rows(devices, set(holders), counter_sets, holders, {c.pk: c.name}, {}, FleetFilter())
    return rows, devices, redact_holders(holders, vis, {c.pk: c.name}), counter_sets


def node_detail(request: HttpRequest, cluster: str, node: str) -> HttpResponse:
    c = get_object_or_404(Cluster, name=cluster)
    n = Node.objects.filter(cluster=c, name=node).first()
    rows, devices, holders, counter_sets = _node_gpus(visibility_for(request.user), c, node)
    if n is None and not devices:
        raise Http404("no such node")
    row = rows.get(heatmap.row_key(c.name, node))
    taints = gpu_taints(devices)
    context = {
        "cluster": c,
        "node_name": node,
        "node": n,
        "gpus": [{"cell": cell, "taints": taints.get(cell[0], [])} for cell in (row[4] if row else [])],
        "devices": overview.device_states(devices, holders, counter_sets),
    }
    return render(request, "fleet/node.html", context)


def gpu_taints(devices: list[dict[str, Any]]) -> dict[int | None, list[str]]:
    """Per GPU index, the NoSchedule/NoExecute taints of its devices as "device: key=value:Effect"."""
    out: dict[int | None, list[str]] = {}
    for d in devices:
        if d["tainted"]:
            lines = out.setdefault(d["gpu_minor"], [])
            lines += [f"{d['name']}: {t}" for t in counts.taint_text(d.get("taints") or ())]
    return out


def _gpu_context(request: HttpRequest, cluster: str, node: str, index: int) -> dict[str, Any]:
    c = get_object_or_404(Cluster, name=cluster)
    rows, devices, holders, counter_sets = _node_gpus(visibility_for(request.user), c, node)
    mine = [d for d in devices if d["gpu_minor"] == index]
    if not mine:
        raise Http404("no such GPU")
    gpu_uuid = mine[0]["gpu_uuid"]
    mine = [d for d in devices if d["gpu_uuid"] == gpu_uuid]
    row = rows.get(heatmap.row_key(c.name, node))
    cell = next((cell for cell in (row[4] if row else []) if cell[0] == index), None)
    device_rows = overview.device_states(mine, holders, counter_sets)
    # One line per claim: hidden claims (blank names) are told apart by object (one per claim, see
    # fleet.access.visibility.redact_holders), visible ones by name.
    held = {(h.namespace, h.name) if h.name else id(h): h for d in device_rows for h in d["holders"]}
    claims = sorted((h.namespace, h.name, h.state) for h in held.values())
    consumers = sorted({u for d in device_rows for h in d["holders"] for u in h.consumers})
    mig = _redact_mig(overview.mig_gpus(mine, holders, counter_sets, {c.pk: c.name}), request)
    return {
        "cluster": c,
        "node_name": node,
        "index": index,
        "gpu_uuid": gpu_uuid,
        "model": mine[0]["model"],
        "product_name": next((d["product_name"] for d in mine if d["product_name"]), ""),
        "cell": cell,
        "taints": gpu_taints(mine).get(index, []),
        "devices": device_rows,
        "claims": claims,
        "consumers": consumers,
        "mig": mig[0] if mig else None,
        "slots": range(7),
    }


def gpu_detail(request: HttpRequest, cluster: str, node: str, index: int) -> HttpResponse:
    return render(request, "fleet/gpu.html", _gpu_context(request, cluster, node, index))


def gpu_card(request: HttpRequest, cluster: str, node: str, index: int) -> HttpResponse:
    """The heatmap's hover panel: an HTML fragment (escaped by the template engine)."""
    return render(request, "fleet/_gpu_card.html", _gpu_context(request, cluster, node, index))


def device_detail(request: HttpRequest, cluster: str) -> HttpResponse:
    c = get_object_or_404(Cluster, name=cluster)
    params = {k: request.GET.get(k, "") for k in ("driver", "pool", "name")}
    missing = [k for k, v in params.items() if not v]
    if missing:
        return HttpResponseBadRequest(f"Missing parameter {missing[0]}\n", content_type="text/plain")
    device = get_object_or_404(Device, cluster=c, **params)
    holders = _visible_holders(visibility_for(request.user), c, [device.pool])
    context = {
        "cluster": c,
        "device": device,
        "holders": holders.get((c.pk, device.driver, device.pool, device.name), []),
        "attributes": sorted(device.attributes.items()),
        "capacity": sorted(device.capacity.items()),
    }
    return render(request, "fleet/device.html", context)


def claim_detail(request: HttpRequest, cluster: str, namespace: str, name: str) -> HttpResponse:
    c = get_object_or_404(Cluster, name=cluster)
    # A claim in a namespace the user may not see is a 404, like a missing one: existence is not confirmed.
    if not visibility_for(request.user).allows(c.name, namespace):
        raise Http404("no such claim")
    claim = get_object_or_404(ResourceClaim, cluster=c, namespace=namespace, name=name)
    allocations = list(DeviceAllocation.objects.filter(cluster=c, claim_uid=claim.uid).order_by("request"))
    devices = {
        (d.driver, d.pool, d.name): d
        for d in Device.objects.filter(cluster=c, pool__in={a.pool for a in allocations})
    }
    uses = PodClaimUse.objects.filter(cluster=c, namespace=namespace, claim_name=name)
    pods = list(Pod.objects.filter(cluster=c, namespace=namespace, uid__in=uses.values("pod_uid")))
    consumer_uids = [str(r.get("uid", "")) for r in claim.reserved_for if isinstance(r, dict)]
    uids = [claim.uid, *(p.uid for p in pods), *consumer_uids]
    events = SchedulingEvent.objects.filter(
        visibility_for(request.user).q(), cluster=c, involved_uid__in=uids
    )
    events = events.order_by("-last_at")[:50]
    context = {
        "cluster": c,
        "claim": claim,
        "spec_json": orjson.dumps(
            {"requests": claim.requests, "constraints": claim.constraints}, option=orjson.OPT_INDENT_2
        ).decode(),
        "allocations": [(a, devices.get((a.driver, a.pool, a.device_name))) for a in allocations],
        "pods": pods,
        "events": events,
    }
    return render(request, "fleet/claim.html", context)
