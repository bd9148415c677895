"""Read queries behind the triage report: the claim history, causes, allocation samples and device kinds of
one window, as :class:`claims.triage.TriageData` (a constant number of queries, whatever the window)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from claims.api.selectors import leak_after
from claims.models import ClaimLifecycle, ClaimStateChange, PendingCause
from claims.triage.report import HOLDING, Allows, TriageData, build_report
from claims.triage.window import window
from fleet.models import AllocationSample, Cluster, Device


class UnknownCluster(LookupError):
    pass


def load(
    since: datetime, until: datetime, cluster: str | None = None, default: bool = False, strict: bool = True
) -> TriageData:
    """Everything the report needs about claims alive at some point in ``[since, until]``. An unknown
    ``cluster`` raises :class:`UnknownCluster` if ``strict``, else has nothing in it (as API filters do)."""
    clusters = Cluster.objects.all()
    if cluster is not None:
        clusters = clusters.filter(name=cluster)
    names = dict(clusters.values_list("id", "name"))
    if cluster is not None and not names and strict:
        raise UnknownCluster(f"no cluster named {cluster!r}")
    alive = ClaimLifecycle.objects.filter(cluster_id__in=names).filter(
        Q(deleted_at__isnull=True) | Q(deleted_at__gte=since)
    )
    fields = ("cluster_id", "uid", "namespace", "name", "from_state", "to_state", "at", "node", "devices")
    changes = _named(
        ClaimStateChange.objects.filter(cluster_id__in=names, at__lte=until)
        .filter(Exists(alive.filter(cluster_id=OuterRef("cluster_id"), uid=OuterRef("uid"))))
        .order_by("cluster_id", "uid", "at", "id")
        .values(*fields),
        names,
    )
    lives = alive.filter(created_at__lte=until).values(
        "cluster_id", "uid", "node", "devices", "allocated_at", "created_at"
    )
    lifecycles = {(row["cluster"], row["uid"]): row for row in _named(lives, names)}
    causes = _named(
        PendingCause.objects.filter(cluster_id__in=names, last_seen__gte=since, first_seen__lte=until).values(
            "cluster_id", "uid", "category", "group_key", "summary", "result", "first_seen", "last_seen"
        ),
        names,
    )
    samples = AllocationSample.objects.filter(cluster_id__in=names, time__gte=since, time__lte=until)
    resolution = "minute" if samples.filter(resolution="minute").exists() else "hour"
    sample_rows = _named(
        samples.filter(resolution=resolution)
        .order_by("cluster_id", "model", "profile", "time")
        .values("time", "cluster_id", "model", "profile", "total", "allocated"),
        names,
    )
    return TriageData(
        since=since,
        until=until,
        cluster=cluster,
        changes=changes,
        lifecycles=lifecycles,
        causes=causes,
        samples=sample_rows,
        devices=_device_kinds(changes, names, since, until),
        leak_after=leak_after(),
        default=default,
    )


def _named(rows: Iterable[Mapping[str, Any]], names: dict[int, str]) -> list[dict[str, Any]]:
    """Rows with the cluster's name under ``cluster`` instead of its id."""
    out = []
    for row in rows:
        named = {k: v for k, v in row.items() if k != "cluster_id"}
        named["cluster"] = names[row["cluster_id"]]
        out.append(named)
    return out


def _device_kinds(
    changes: list[dict[str, Any]], names: dict[int, str], since: datetime, until: datetime
) -> dict[tuple[str, str], tuple[str, str]]:
    """(model, MIG profile) of the devices released in the window, by (cluster name, driver/pool/device)."""
    wanted = {
        (c["cluster"], d)
        for c in changes
        if c["from_state"] in HOLDING and since <= c["at"] < until
        for d in c["devices"]
    }
    if not wanted:
        return {}
    device_names = sorted({d.rsplit("/", 1)[-1] for _, d in wanted})
    out: dict[tuple[str, str], tuple[str, str]] = {}
    rows = Device.objects.filter(cluster_id__in=names, name__in=device_names).values_list(
        "cluster_id", "driver", "pool", "name", "model", "mig_profile"
    )
    for cluster_id, driver, pool, name, model, profile in rows:
        key = (names[cluster_id], f"{driver}/{pool}/{name}")
        if key in wanted:
            out[key] = (model, profile)
    return out


def report(
    since: str | None,
    until: str | None,
    cluster: str | None,
    allows: Allows,
    now: datetime | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """The triage report for texts as users give them (page, API and command all come through here).

    Raises ``WindowError`` for a bad ``since``/``until`` and :class:`UnknownCluster`."""
    tz = ZoneInfo(settings.TIME_ZONE)
    start, end, default = window(since, until, now or timezone.now(), tz)
    return build_report(load(start, end, cluster, default, strict), allows)
