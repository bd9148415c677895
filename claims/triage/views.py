"""The printable triage page: ``/claims/triage/?since=&until=&cluster=`` (login required by middleware).

Thin: the report comes from ``claims.triage.selectors.report`` (the same data as the API and the command); the
view only adds display text. The report is also embedded as JSON (``json_script``) for the chart, so the page
shows exactly the data the API returns.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from claims.triage.selectors import UnknownCluster, report
from claims.triage.window import WindowError, duration_text
from fleet.access.visibility import visibility_for
from fleet.models import Cluster


def _param(request: HttpRequest, name: str) -> str | None:
    value = request.GET.get(name, "").replace("\x00", "").strip()
    return value or None


TIME_FIELDS = ("pending_since", "pending_until", "at", "start", "end", "allocated_at", "unreserved_since")


def when_text(iso: str | None) -> str:
    """``Fri 6 Mar 21:16`` in the server's time zone (the ISO time stays in the cell's title)."""
    if not iso:
        return "—"
    local = timezone.localtime(datetime.fromisoformat(iso.replace("Z", "+00:00")))
    return f"{local:%a} {local.day} {local:%b %H:%M}"


def _display(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with display text: ``duration`` and ``<time field>_text``."""
    out = []
    for r in rows:
        shown = {**r, **{f"{k}_text": when_text(r[k]) for k in TIME_FIELDS if k in r}}
        if "seconds" in r:
            shown["duration"] = duration_text(r["seconds"])
        out.append(shown)
    return out


def triage_page(request: HttpRequest) -> HttpResponse:
    typed = {
        "since": _param(request, "since"),
        "until": _param(request, "until"),
        "cluster": _param(request, "cluster"),
    }
    values = dict(typed)
    errors: dict[str, str] = {}
    # A bad field is dropped (the report falls back to its default there) and its message shown beside it.
    while True:
        try:
            data = report(
                values["since"], values["until"], values["cluster"], visibility_for(request.user).allows
            )
            break
        except WindowError as exc:
            field = (
                exc.parameter
                if values.get(exc.parameter)
                else next(k for k in ("since", "until") if values[k])
            )
            errors[field] = f"Bad {exc.parameter}: {exc.message}"
            values[field] = None
        except UnknownCluster as exc:
            errors["cluster"] = f"Bad cluster: {exc}"
            values["cluster"] = None
    since, until, cluster = typed["since"], typed["until"], typed["cluster"]
    context = {
        "report": data,
        "since_text": when_text(data["window"]["since"]),
        "until_text": when_text(data["window"]["until"]),
        "tz": timezone.get_current_timezone_name(),
        "pended": _display(data["pended"]),
        "freed": _display(data["freed"]),
        "mig": _display(data["mig_exhaustion"]),
        "leaks": _display(data["leaks"]),
        "query": {"since": since or "", "until": until or "", "cluster": cluster or ""},
        "errors": errors,
        "cluster_choices": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
    }
    return render(request, "claims/triage.html", context, status=400 if errors else 200)
