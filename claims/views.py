"""Claim pages: the pending page (grouped by cause, with the "Will it fit?" form) and a claim's diagnosis.

Views parse input, call ``claims.selectors`` (queries, visibility) and ``claims.causes`` (grouping), and
render. Foreign namespaces are invisible: rows are filtered in SQL, a foreign claim's page is a 404.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from claims import selectors
from claims.api.diagnosis import WHATIF_KINDS
from claims.causes import CauseGroup, Pending, cause_of, group_causes
from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from fleet.access.visibility import Visibility, redact_diagnosis, visibility_for
from fleet.normalize import NormalizeError, clean_pasted_claim
from fleet.snapshot import SnapshotError, read_text

log = logging.getLogger(__name__)
SORT_LABELS = ("oldest first", "newest first", "namespace", "cluster", "name")
ROWS_PER_CAUSE = 50  # rows under each cause on the unfiltered page; the cause's permalink lists them all
MAX_PASTE = 256 * 1024  # a claim or template is a few KB; this bounds what the form parses


def humanize_age(delta: timedelta) -> str:
    """``3d 4h``, ``5h 12m``, ``7m``: two units at most (exact time in the title attribute)."""
    minutes = max(int(delta.total_seconds() // 60), 0)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {mins}m"
    return f"{mins}m"


@dataclass
class Row:
    """One pending claim or waiting pod as the page shows it."""

    item: Pending
    cause: str
    age: str
    url: str


def _row(item: Pending, now: datetime) -> Row:
    url = ""
    if item.kind == "claim":
        try:
            url = reverse("claims:diagnosis", args=[item.cluster, item.namespace, item.name])
        except NoReverseMatch:
            # Stored before names were checked at normalize (or by a broken source): shown, not linked,
            # so one such row cannot fail the page for everyone.
            log.warning(
                "claim %s/%s/%s has a name no page can link to", item.cluster, item.namespace, item.name
            )
    return Row(item, cause_of(item).key, humanize_age(now - item.since), url)


# Categories where the devices matching the requests explain the wait (held, tainted, blocked...).
DEVICE_CATEGORIES = frozenset({"capacity", "fragmentation", "taint", "pool", "constraint", "fits"})


def heatmap_links(cluster: str, result: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(label, URL) of the heatmap (or MIG page) filtered to the models of the devices that match the
    claim's requests, e.g. ("B200 GPUs", "/fleet/heatmap/?cluster=c&model=B200"); none for categories
    where no device is at stake (CEL errors, no match...)."""
    if (result or {}).get("category") not in DEVICE_CATEGORIES:
        return []
    seen: dict[tuple[str, bool], None] = {}
    # Typed as the engine writes them; a malformed stored result gets no links, not a failed page.
    requests = (result or {}).get("requests")
    for request in requests if isinstance(requests, list) else []:
        groups = request.get("groups") if isinstance(request, dict) else None
        for g in groups if isinstance(groups, list) else []:
            if isinstance(g, dict) and g.get("matching") and g.get("model"):
                seen[(str(g["model"]), bool(g.get("profile")))] = None
    links = []
    for model, mig in seen:
        page = "fleet:mig" if mig else "fleet:heatmap"
        query = urlencode({"cluster": cluster, "model": model})
        links.append((f"{model} {'MIG slots' if mig else 'GPUs'}", f"{reverse(page)}?{query}"))
    return links


def with_holder_urls(result: dict[str, Any] | None, cluster: str) -> dict[str, Any] | None:
    """A copy of ``result`` whose holder entries carry the URL of the holding claim's page (none for a
    claim of another namespace: redaction already replaced its name)."""
    if not result:
        return result
    requests = []
    for r in result.get("requests") or []:
        holders = []
        for h in r.get("holders") or []:
            namespace, sep, name = str(h.get("claim", "")).partition("/")
            url = reverse("fleet:claim", args=[cluster, namespace, name]) if sep and name else ""
            holders.append({**h, "url": url})
        requests.append({**r, "holders": holders} if holders else r)
    return {**result, "requests": requests}


# --------------------------------------------------------------------------------------- pending page


class WhatIfForm(forms.Form):
    """A pasted ResourceClaim or ResourceClaimTemplate (YAML or JSON) and the cluster to try it on."""

    cluster = forms.ChoiceField(choices=())
    spec = forms.CharField(
        label="ResourceClaim or ResourceClaimTemplate (YAML or JSON)",
        widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false"}),
        max_length=MAX_PASTE,
    )

    def __init__(self, *args: Any, clusters: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["cluster"].choices = [(c, c) for c in clusters]  # type: ignore[attr-defined]
        if len(clusters) == 1:
            self.fields["cluster"].initial = clusters[0]

    def clean_spec(self) -> dict[str, Any]:
        text = self.cleaned_data["spec"]
        try:
            objs = read_text(text, "pasted text")
        except SnapshotError as exc:
            raise forms.ValidationError(str(exc)) from None
        found = [o for o in objs if o.get("kind") in WHATIF_KINDS]
        if not found:
            kinds = sorted({str(o.get("kind")) for o in objs if o.get("kind")})
            raise forms.ValidationError(
                f"no {' or '.join(WHATIF_KINDS)} in the pasted text"
                + (f" (found {', '.join(kinds)})" if kinds else " (is `kind:` set?)")
            )
        obj = found[0]
        if not isinstance(obj.get("spec"), dict):
            raise forms.ValidationError(f"the {obj['kind']} has no spec")
        try:
            return clean_pasted_claim(obj)
        except NormalizeError as exc:
            # Lint and diagnosis read the spec as the API server would have checked it: refuse other shapes.
            raise forms.ValidationError(f"{exc.field}: {exc.problem}") from None


def _whatif(form: WhatIfForm, vis: Visibility) -> dict[str, Any] | None:
    """The what-if diagnosis (the same path as ``POST /api/v1/whatif``), redacted for ``vis``."""
    if not form.is_valid():
        return None
    cluster = form.cleaned_data["cluster"]
    try:
        state = FleetState.from_db(cluster, lean=True)  # the claim is the form's: see the API's what-if
    except LookupError as exc:
        form.add_error("cluster", str(exc.args[0]))
        return None
    # Pods of a claim named in a namespace the user may not see are not looked at (their scheduling
    # messages, even their existence, are not the user's to know): the claim is diagnosed as a new one.
    with state:  # released when done (FleetState.release)
        spec = form.cleaned_data["spec"]
        result = diagnose(state, spec, pods_in=lambda namespace: vis.allows(cluster, namespace)).as_dict()
    return with_holder_urls(dict(redact_diagnosis(result, vis, cluster)), cluster)


def _bad(exc: Exception) -> HttpResponse:
    return HttpResponseBadRequest(f"Bad parameter {exc}\n", content_type="text/plain")


def _pending_context(request: HttpRequest, query: selectors.PendingQuery) -> dict[str, Any]:
    with selectors.one_snapshot():
        return _pending_context_of(request, query)


def _pending_context_of(request: HttpRequest, query: selectors.PendingQuery) -> dict[str, Any]:
    vis = visibility_for(request.user)
    now = timezone.now()
    every = selectors.pending_items(vis, query.cluster, query.namespace)
    seen: dict[Any, Pending] = {}

    def results(firsts: list[Pending]) -> list[Pending]:
        # Only each group's oldest member is read (its summary and links quote it); both groupings
        # below share what was read.
        missing = [p for p in firsts if (p.kind, p.ref) not in seen]
        seen.update({(p.kind, p.ref): p for p in selectors.with_results(missing, vis)})
        return [seen[(p.kind, p.ref)] for p in firsts]

    # The cause list ignores the cause filter, so that the other causes stay one click away.
    ages = selectors.PendingQuery(min_age=query.min_age, max_age=query.max_age)
    causes = group_causes(selectors.with_age(every, ages, now), read=results)
    items = selectors.with_age(every, query, now)
    groups: list[CauseGroup] = group_causes(items, read=results)
    # Unfiltered, a cause shows its first rows and links to its permalink for all of them: rendering
    # every row of 2,000 pending claims took seconds per request.
    limit = None if query.cause else ROWS_PER_CAUSE
    return {
        "query": query,
        "now": now,
        "total": len(items),
        "causes": [
            {
                "group": g,
                "url": "?" + query.query(cause=g.key),
                "on": query.cause in (g.key, g.category),
                "age": humanize_age(now - g.oldest),
            }
            for g in causes
        ],
        "sections": [
            {
                "group": g,
                "rows": [_row(i, now) for i in selectors.sort_items(g.members, query.sort)[:limit]],
                "more": max(0, len(g.members) - limit) if limit else 0,
                "links": heatmap_links(g.cluster, dict(g.members[0].result or {})),
                "url": "?" + query.query(cause=g.key),
            }
            for g in (groups if query.group != "none" else [])
        ],
        # Only the table shown is built: rows are most of the page's time on a large fleet.
        "flat": [_row(i, now) for i in selectors.sort_items(items, query.sort)]
        if query.group == "none"
        else [],
        "sort_links": [
            (sort, label, "?" + query.query(sort=sort), query.sort == sort)
            for sort, label in zip(selectors.SORTS, SORT_LABELS, strict=True)
        ],
        # A bare category in the permalink (``cause=capacity``) gets its own option in the select.
        "cause_category": query.cause if query.cause and all(query.cause != g.key for g in causes) else "",
        "cluster_choices": selectors.cluster_names(),
        "namespace_choices": selectors.visible_namespaces(vis, query.cluster),
        "ws": "/ws/pending/?" + query.query(),
        "fragment": reverse("claims:pending-fragment") + "?" + query.query(),
    }


def _parse(params: Mapping[str, str]) -> selectors.PendingQuery:
    query = selectors.parse_pending_query(params)
    if query.cluster and query.cluster not in selectors.cluster_names():
        raise selectors.QueryError("cluster", f"no cluster named {query.cluster!r}")
    return query


def _parse_leniently(request: HttpRequest) -> tuple[selectors.PendingQuery, dict[str, str]]:
    """The query without its bad parameters, and a message per bad parameter: the page re-renders its form
    with each message beside its field instead of answering bare text."""
    params = {key: request.GET.get(key, "") for key in selectors.PARAMETERS}
    errors: dict[str, str] = {}
    while True:
        try:
            return _parse(params), errors
        except selectors.QueryError as exc:
            errors[exc.parameter] = str(exc).removeprefix(f"{exc.parameter}: ")
            params[exc.parameter] = ""


def pending_page(request: HttpRequest) -> HttpResponse:
    """Every pending claim and waiting pod, grouped by cause; POST runs the "Will it fit?" form."""
    query, errors = _parse_leniently(request)
    clusters = selectors.cluster_names()
    whatif = None
    if request.method == "POST":
        form = WhatIfForm(request.POST, clusters=clusters)
        whatif = _whatif(form, visibility_for(request.user))
    else:
        form = WhatIfForm(clusters=clusters, initial={"cluster": query.cluster} if query.cluster else None)
    context = _pending_context(request, query)
    context.update(
        {
            "form": form,
            "whatif": whatif,
            "filter_errors": errors,
            # What the user typed into a bad field stays in it, beside its message.
            "typed": {key: request.GET.get(key, "")[:80] for key in errors},
        }
    )
    if whatif is not None:
        context["whatif_links"] = heatmap_links(form.cleaned_data["cluster"], whatif)
    status = 400 if errors or (request.method == "POST" and not form.is_valid()) else 200
    return render(request, "claims/pending.html", context, status=status)


def pending_fragment(request: HttpRequest) -> HttpResponse:
    """The grouped rows alone (what the live page swaps in when the websocket says something changed)."""
    try:
        query = _parse(request.GET)
    except selectors.QueryError as exc:
        return _bad(exc)
    return render(request, "claims/_pending_groups.html", _pending_context(request, query))


# ------------------------------------------------------------------------------------- claim diagnosis


def claim_diagnosis(request: HttpRequest, cluster: str, namespace: str, name: str) -> HttpResponse:
    """Our diagnosis of one claim beside the scheduler's own words; 404 for a foreign or unknown claim."""
    vis = visibility_for(request.user)
    claim = selectors.claim_for_diagnosis(vis, cluster, namespace, name)
    if claim is None:
        raise Http404("no such claim")
    page = selectors.diagnosis_page(vis, claim)
    now = timezone.now()
    context = {
        "page": page,
        "claim": claim,
        "cluster": page.cluster,
        "result": with_holder_urls(page.result, page.cluster.name),
        "age": humanize_age(now - (claim.created_at or claim.synced_at)),
        "since": claim.created_at or claim.synced_at,
        "links": heatmap_links(page.cluster.name, page.result),
        "pending_url": reverse("claims:pending")
        + "?"
        + urlencode({"cluster": cluster, "namespace": namespace}),
        "scheduler_messages": [
            (p.name, p.scheduled_reason, p.scheduled_message) for p in page.pods if p.scheduled_message
        ],
    }
    return render(request, "claims/diagnosis.html", context)
