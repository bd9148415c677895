"""``/metrics``: claimscope's own state in the Prometheus exposition format, for alerting.

Off unless ``CLAIMSCOPE_METRICS_TOKEN`` is set; then a scrape must send ``Authorization: Bearer <token>``
(compared in constant time). The values are read from the database at scrape time by a custom collector
(``prometheus-client``), so every web process answers the same and nothing is kept between scrapes.
Counting rules are the fleet's (``fleet.selectors.fleet_summary``), so the numbers match the pages.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from claims.models import ClaimDiagnosis
from fleet.models import Cluster, ResourceClaim, WatchCursor
from fleet.selectors import fleet_summary
from usage.models import DeviceUsage, SamplingState

PENDING_STATE = "pending"


def _age(now: datetime, then: datetime | None) -> float:
    return max((now - then).total_seconds(), 0.0) if then else 0.0


class ClaimscopeCollector:
    """Gauges of the fleet, the pending claims, the watch streams (and their relist counter), the diagnoses
    and the utilization."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        clusters = {c.pk: c.name for c in Cluster.objects.all()}
        yield from self._pending(now, clusters)
        yield from self._devices(clusters)
        yield from self._streams(now, clusters)
        yield from self._utilization(now, clusters)

    def _pending(self, now: datetime, clusters: dict[int, str]) -> Iterator[Metric]:
        pending = GaugeMetricFamily(
            "claimscope_pending_claims",
            "Pending ResourceClaims by diagnosed cause",
            labels=["cluster", "cause"],
        )
        claims = ResourceClaim.objects.filter(state=PENDING_STATE, deleted_at__isnull=True)
        causes = dict(
            ClaimDiagnosis.objects.filter(claim__state=PENDING_STATE).values_list(
                "claim_id", "shape__category"
            )
        )
        counts: Counter[tuple[str, str]] = Counter()
        for pk, cid in claims.values_list("pk", "cluster_id"):
            counts[(clusters.get(cid, ""), causes.get(pk, "undiagnosed"))] += 1
        for (cluster, cause), n in sorted(counts.items()):
            pending.add_metric([cluster, cause], n)
        yield pending
        oldest = GaugeMetricFamily(
            "claimscope_oldest_pending_seconds", "Age of the oldest pending claim", labels=["cluster"]
        )
        for cid, first in claims.values_list("cluster_id").annotate(first=Min("created_at")):
            oldest.add_metric([clusters.get(cid, "")], _age(now, first))
        yield oldest
        diagnosis = GaugeMetricFamily(
            "claimscope_diagnosis_age_seconds",
            "Age of the stalest diagnosis of a pending claim",
            labels=["cluster"],
        )
        stale = ClaimDiagnosis.objects.filter(claim__state=PENDING_STATE).values_list("claim__cluster_id")
        for cid, computed in stale.annotate(oldest=Min("shape__computed_at")):
            diagnosis.add_metric([clusters.get(cid, "")], _age(now, computed))
        yield diagnosis

    def _devices(self, clusters: dict[int, str]) -> Iterator[Metric]:
        devices = GaugeMetricFamily(
            "claimscope_devices",
            "GPU and MIG devices by state (free, allocated, unavailable, tainted)",
            labels=["cluster", "model", "kind", "profile", "state"],
        )
        for cid, name in sorted(clusters.items(), key=lambda c: c[1]):
            for g in fleet_summary(cid).groups:
                for state in ("free", "allocated", "unavailable", "tainted"):
                    devices.add_metric([name, g.model, g.kind, g.profile, state], getattr(g, state))
        yield devices

    def _streams(self, now: datetime, clusters: dict[int, str]) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "claimscope_watch_last_event_age_seconds",
            "Time since a watch stream's last event (bookmarks included): its lag when it stops moving",
            labels=["cluster", "kind"],
        )
        healthy = GaugeMetricFamily(
            "claimscope_watch_stream_state",
            "1 for the state each watch stream is in (listing: relisting)",
            labels=["cluster", "kind", "state"],
        )
        relists = CounterMetricFamily(
            "claimscope_watch_relists",
            "Lists that replaced a watch stream's position (after a 410 Gone, an interrupted list, a server "
            "that went back in time); the first list is not one. Kept in the database: survives restarts",
            labels=["cluster", "kind"],
        )
        for c in WatchCursor.objects.order_by("cluster_id", "kind"):
            cluster = clusters.get(c.cluster_id, "")
            lag.add_metric([cluster, c.kind], _age(now, c.last_event_at or c.updated_at))
            healthy.add_metric([cluster, c.kind, c.state], 1)
            relists.add_metric([cluster, c.kind], c.relists)
        yield lag
        yield healthy
        yield relists

    def _utilization(self, now: datetime, clusters: dict[int, str]) -> Iterator[Metric]:
        idle = GaugeMetricFamily(
            "claimscope_idle_allocated_devices",
            "Allocated devices below the idle threshold for the idle window",
            labels=["cluster"],
        )
        window = settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES * 60
        for cid, name in sorted(clusters.items(), key=lambda c: c[1]):
            rows = DeviceUsage.objects.filter(cluster_id=cid, idle_since__isnull=False)
            idle.add_metric(
                [name], sum(1 for t in rows.values_list("idle_since", flat=True) if _age(now, t) >= window)
            )
        yield idle
        unavailable = GaugeMetricFamily(
            "claimscope_utilization_unavailable_seconds",
            "How long the cluster's Prometheus has not answered (0: it answers)",
            labels=["cluster"],
        )
        unmatched = GaugeMetricFamily(
            "claimscope_utilization_unmatched_series",
            "DCGM entities of the last round that matched no device, by reason",
            labels=["cluster", "reason"],
        )
        for s in SamplingState.objects.all():
            cluster = clusters.get(s.cluster_id, "")
            unavailable.add_metric([cluster], _age(now, s.unavailable_since))
            for reason, n in sorted(s.unmatched.items()):
                unmatched.add_metric([cluster, reason], n)
        yield unavailable
        yield unmatched


def _authorized(request: HttpRequest) -> bool:
    token = settings.CLAIMSCOPE_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), token)


@login_not_required  # a scraper has no session: the bearer token is its login
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not settings.CLAIMSCOPE_METRICS_TOKEN:
        return HttpResponse(
            "metrics are off: set CLAIMSCOPE_METRICS_TOKEN\n", status=404, content_type="text/plain"
        )
    if not _authorized(request):
        response = HttpResponse("a valid bearer token is required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="claimscope metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClaimscopeCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
