"""Read queries behind the pending page, the claim diagnosis page and the pending websocket.

Everything here is filtered by a :class:`~fleet.access.visibility.Visibility`: rows of namespaces the user may
not see are never loaded, and diagnosis texts that name foreign claims (holders) are redacted. The query
string of the pending page is parsed here too (:func:`parse_pending_query`), so the page, its live
fragment and the tests share one reading of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from urllib.parse import urlencode

import orjson
from django.db import connection, transaction
from django.db.models import DateTimeField, F, Func, Q, QuerySet, TextField
from django.db.models.functions import Coalesce
from django.utils import timezone

from claims.causes import Brief, Pending, cause_of
from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from claims.models import ClaimDiagnosis
from claims.shaped import put_names
from fleet.access.visibility import Visibility, redact_diagnosis
from fleet.models import Cluster, Pod, PodClaimUse, ResourceClaim, ResourceClaimTemplate, SchedulingEvent
from fleet.normalize import pod_claim_names

SORTS = ("age", "-age", "namespace", "cluster", "name")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_CAUSE = re.compile(r"^[a-z-]{1,32}(-[0-9a-f]{10})?$")
_AGE = re.compile(r"^(\d{1,6})([mhd])$")
_AGE_UNITS = {"m": "minutes", "h": "hours", "d": "days"}
PARAMETERS = ("cluster", "namespace", "cause", "min_age", "max_age", "sort", "group")


class QueryError(ValueError):
    """A pending-page parameter has a value we cannot use."""

    def __init__(self, parameter: str, problem: str) -> None:
        super().__init__(f"{parameter}: {problem}")
        self.parameter = parameter


@dataclass(frozen=True)
class PendingQuery:
    """The pending page's filters and ordering, as in its query string (every view is a permalink).

    ``cause`` is a group key (``capacity-3f9a…``) or a bare category (``capacity``); ages are like
    ``30m``, ``6h``, ``2d``; ``group`` is ``cause`` (rows under their cause) or ``none`` (one table)."""

    cluster: str = ""
    namespace: str = ""
    cause: str = ""
    min_age: str = ""
    max_age: str = ""
    sort: str = "age"
    group: str = "cause"

    def query(self, **override: str) -> str:
        """The permalink query string (without "?"); defaults are left out."""
        values = {p: getattr(self, p) for p in PARAMETERS} | override
        defaults = PendingQuery()
        return urlencode([(k, v) for k, v in values.items() if v and v != getattr(defaults, k)])

    def age_bounds(self) -> tuple[timedelta | None, timedelta | None]:
        return _age(self.min_age), _age(self.max_age)

    def keeps(self, item: Pending, now: datetime) -> bool:
        """Whether ``item`` passes the cause and age filters (cluster and namespace are applied in SQL)."""
        if self.cause:
            cause = cause_of(item)
            if self.cause not in (cause.key, cause.category):
                return False
        low, high = self.age_bounds()
        age = now - item.since
        return (low is None or age >= low) and (high is None or age <= high)


def _age(text: str) -> timedelta | None:
    found = _AGE.match(text)
    if not found:
        return None
    return timedelta(**{_AGE_UNITS[found.group(2)]: int(found.group(1))})


def parse_pending_query(params: Mapping[str, str]) -> PendingQuery:
    """Read the pending page's parameters; unknown ones are ignored, a bad value raises QueryError."""
    values = {p: (params.get(p) or "").strip() for p in PARAMETERS}
    for name in ("cluster", "namespace"):
        if values[name] and not _NAME.match(values[name]):
            raise QueryError(name, f"{values[name][:80]!r} is not a valid name")
    if values["cause"] and not _CAUSE.match(values["cause"]):
        raise QueryError("cause", f"{values['cause'][:80]!r} is not a cause key or category")
    for name in ("min_age", "max_age"):
        if values[name] and not _AGE.match(values[name]):
            raise QueryError(name, f"{values[name][:80]!r} is not an age like 30m, 6h or 2d")
    if values["sort"] and values["sort"] not in SORTS:
        raise QueryError("sort", f"{values['sort'][:80]!r} is not one of {', '.join(SORTS)}")
    if values["group"] and values["group"] not in ("cause", "none"):
        raise QueryError("group", f"{values['group'][:80]!r} is not cause or none")
    return PendingQuery(**{k: v for k, v in values.items() if v})


def sort_items(items: Iterable[Pending], sort: str) -> list[Pending]:
    """Rows in the requested order; ties broken by age (oldest first), then by name."""
    ordered = sorted(items, key=lambda i: (i.since, i.cluster, i.namespace, i.name))
    if sort == "-age":
        return ordered[::-1]
    if sort == "namespace":
        return sorted(ordered, key=lambda i: i.namespace)
    if sort == "cluster":
        return sorted(ordered, key=lambda i: i.cluster)
    if sort == "name":
        return sorted(ordered, key=lambda i: (i.namespace, i.name))
    return ordered


# ---------------------------------------------------------------------------------------- pending rows


def _pod_claim_names(pod: Pod) -> tuple[set[str], bool]:
    """(names of the claims the pod uses, whether some reference has no claim yet)."""
    return pod_claim_names(pod.claim_refs, pod.claim_statuses)


class _PendingClaim(NamedTuple):
    pk: int
    cluster: str
    namespace: str
    name: str
    since: datetime  # created, else first seen


def pending_items(vis: Visibility, cluster: str = "", namespace: str = "") -> list[Pending]:
    """Every visible pending claim, and every visible pod waiting for a claim that was never created.

    Pods waiting for a pending claim are listed on that claim's row (``Pending.pods``). Diagnoses are the
    stored ones (``None`` until the task ran), redacted for ``vis``. Three queries, one more when a waiting
    pod's claims are not pending, four more when some pod's claim is missing."""
    scope = Q(cluster__name=cluster) if cluster else Q()
    if namespace:
        scope &= Q(namespace=namespace)
    pending = ResourceClaim.objects.filter(vis.q(), scope, state="pending", deleted_at__isnull=True)
    # Rows, not model instances: building 2,000 instances was half of the L fleet page's time. One
    # timestamp per row, not two: converting 12,000 of them took 80 ms of the XL page.
    claims = [
        _PendingClaim(*row)
        for row in pending.annotate(
            since=Coalesce("created_at", "synced_at", output_field=DateTimeField())
        ).values_list("id", "cluster__name", "namespace", "name", "since")
    ]
    # Each diagnosis's brief, not its result: reading and decoding the L fleet's 2,000 results was most of
    # the page's time, and a page shows the results of a few rows only (see with_results).
    briefs: dict[int, Brief] = {}
    keyless: list[int] = []
    for claim_id, key, category, summary, *names in ClaimDiagnosis.objects.filter(
        claim_id__in=[c.pk for c in claims]
    ).values_list("claim_id", "shape__group_key", "shape__category", "shape__summary", *_READ_WITH):
        summary = _own(summary, *names)
        # A key not of the row's category (a damaged row): the row is grouped from its result.
        if key.startswith(f"{category}-"):
            briefs[claim_id] = Brief(key, category, summary)
        else:
            keyless.append(claim_id)
    results = _listed_results(keyless)
    waiting = list(
        Pod.objects.filter(vis.q(), scope, node_name="")
        .exclude(claim_refs=[])
        .exclude(phase__in=("Succeeded", "Failed"))
        .select_related("cluster")
        .only(
            "id",
            "uid",
            "cluster__name",
            "namespace",
            "name",
            "created_at",
            "synced_at",
            "claim_refs",
            "claim_statuses",
        )  # not ``raw``: only pods whose claim is missing need it (read by _orphan_items)
    )
    pods_of: dict[tuple[str, str, str], list[str]] = {}
    pending_names = {(c.cluster, c.namespace, c.name) for c in claims}
    unsure: list[tuple[Pod, set[str]]] = []  # pods whose claims are neither pending nor surely missing
    orphans: list[Pod] = []
    for pod in waiting:
        names, missing = _pod_claim_names(pod)
        for name in names:
            if (pod.cluster.name, pod.namespace, name) in pending_names:
                pods_of.setdefault((pod.cluster.name, pod.namespace, name), []).append(pod.name)
        if missing:
            orphans.append(pod)
        elif not any((pod.cluster.name, pod.namespace, n) in pending_names for n in names):
            unsure.append((pod, names))
    orphans += _missing_claims(unsure)
    items = [
        Pending(
            cluster=c.cluster,
            namespace=c.namespace,
            name=c.name,
            since=c.since,
            result=_redacted(results.get(c.pk), vis, c.cluster),
            kind="claim",
            pods=tuple(sorted(pods_of.get((c.cluster, c.namespace, c.name), []))),
            ref=c.pk,
            brief=_redacted_brief(briefs.get(c.pk), vis, c.cluster),
        )
        for c in claims
    ]
    items += _orphan_items(orphans, vis)
    return items


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Reads that all see one committed state: the pending list reads its rows, then the results of the
    rows it quotes, and a diagnosis update committed in between must not show in one and not the other.
    On PostgreSQL a read-only repeatable-read transaction, unless the caller already opened one. Not on
    SQLite: its transactions begin IMMEDIATE here (one writer at a time), so a page would hold up the
    workers' writes; there a concurrent update shows at the latest on the fragment's next refresh."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def with_results(items: list[Pending], vis: Visibility) -> list[Pending]:
    """``items`` with their stored results as the list reads them (see :class:`ListedResult`), redacted
    for ``vis``; one query. An item with a result, or without a stored diagnosis, is returned as it is."""
    wanted = [i.ref for i in items if i.kind == "claim" and i.result is None and i.brief is not None]
    results = _listed_results(wanted)
    return [
        replace(i, result=_redacted(results[i.ref], vis, i.cluster))
        if i.kind == "claim" and i.result is None and i.ref in results
        else i
        for i in items
    ]


def _listed_results(claim_ids: list[int]) -> dict[int, Any]:
    """The stored results of these claims as the list reads them. Read as text and decoded by orjson:
    Django decodes JSON columns with the stdlib, several times slower."""
    if not claim_ids:
        return {}
    return {
        claim_id: _listed(orjson.loads(_own(text, *names)))
        for claim_id, text, *names in ClaimDiagnosis.objects.filter(claim_id__in=claim_ids)
        .annotate(text=ListedResult())
        .values_list("claim_id", "text", *_READ_WITH)
        if text is not None
    }


# What a claim's stored diagnosis is read with (claims.shaped): the names that replace the placeholders,
# and whether its shape's text holds them.
_READ_WITH = ("claim__name", "claim__uid", "pod_name", "shape__named")


def _own(text: str, name: str, uid: str, pod_name: str, named: bool) -> str:
    return put_names(text, name, uid, pod_name, named=named)


def _redacted_brief(brief: Brief | None, vis: Visibility, cluster: str) -> Brief | None:
    if brief is None or vis.all_namespaces:
        return brief
    return replace(brief, summary=str(redact_diagnosis(brief.summary, vis, cluster)))


class ListedResult(Func):
    """A stored diagnosis as the pending list reads it, as JSON text: without each request's holders and
    the placement, which only a claim's own page shows (half of a result's 5 KB, and of the list's time
    decoding 2,000 of them). PostgreSQL leaves them out before sending; SQLite sends the whole text (its
    JSON column is text) and :func:`_listed` drops them."""

    template = "%(expressions)s"
    output_field = TextField()

    def __init__(self) -> None:
        super().__init__(F("shape__result"))

    def as_postgresql(
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, tuple[Any, ...]]:
        r, params = compiler.compile(self.source_expressions[0])
        # Guarded by type: one malformed stored result must not fail the list for everyone.
        sql = (
            f"CASE WHEN jsonb_typeof({r}) <> 'object' THEN {r}::text"
            f" WHEN jsonb_typeof({r}->'requests') IS DISTINCT FROM 'array' THEN ({r} - 'placement')::text"
            f" ELSE jsonb_set({r} - 'placement', '{{requests}}', (SELECT coalesce(jsonb_agg("
            "CASE WHEN jsonb_typeof(q) = 'object' THEN q - 'holders' ELSE q END ORDER BY n), '[]'::jsonb)"
            f" FROM jsonb_array_elements({r}->'requests') WITH ORDINALITY AS t(q, n)))::text END"
        )
        return sql, tuple(params) * sql.count(r)


def _listed(result: Any) -> Any:
    """``result`` without what :class:`ListedResult` leaves out (for the databases that send it whole)."""
    if not isinstance(result, dict):
        return result
    out = {k: v for k, v in result.items() if k != "placement"}
    requests = out.get("requests")
    if isinstance(requests, list):
        out["requests"] = [
            {k: v for k, v in r.items() if k != "holders"} if isinstance(r, dict) else r for r in requests
        ]
    return out


def _missing_claims(pods: list[tuple[Pod, set[str]]]) -> list[Pod]:
    """The pods naming a claim that does not exist (one query). A pod whose claims all exist and are
    allocated waits for something else than a claim: it is not listed."""
    if not pods:
        return []
    wanted = Q()
    for pod, names in pods:
        wanted |= Q(cluster_id=pod.cluster_id, namespace=pod.namespace, name__in=sorted(names))
    found = set(
        ResourceClaim.objects.filter(wanted, deleted_at__isnull=True).values_list(
            "cluster_id", "namespace", "name"
        )
    )
    return [p for p, names in pods if any((p.cluster_id, p.namespace, n) not in found for n in names)]


def _redacted(result: Any, vis: Visibility, cluster: str) -> dict[str, Any] | None:
    if not isinstance(result, dict):
        return None
    return dict(redact_diagnosis(result, vis, cluster))


def _orphan_items(pods: list[Pod], vis: Visibility) -> list[Pending]:
    """Pods whose claim was never created, diagnosed now: the engine's not-created path only needs the pod,
    its events, the namespace's templates and the pod's other claims, so a tiny fleet state is enough (no
    devices). Four queries."""
    if not pods:
        return []
    events: dict[str, list[dict[str, Any]]] = {}
    for uid, raw in SchedulingEvent.objects.filter(involved_uid__in=[p.uid for p in pods]).values_list(
        "involved_uid", "raw"
    ):
        events.setdefault(uid, []).append({**raw, "kind": "Event"})
    wanted = Q()
    for p in pods:
        wanted |= Q(cluster_id=p.cluster_id, namespace=p.namespace)
    templates: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for cluster_id, namespace, raw in ResourceClaimTemplate.objects.filter(wanted).values_list(
        "cluster_id", "namespace", "raw"
    ):
        templates.setdefault((cluster_id, namespace), []).append({**raw, "kind": "ResourceClaimTemplate"})
    # The claims these pods do have: the engine walks a pod's references in order and stops at the first
    # missing one, so an existing claim must be found for it to reach the missing one.
    existing: dict[tuple[int, str], list[dict[str, Any]]] = {}
    named = Q()
    for p in pods:
        named |= Q(cluster_id=p.cluster_id, namespace=p.namespace, name__in=sorted(_pod_claim_names(p)[0]))
    for cluster_id, namespace, raw in ResourceClaim.objects.filter(named).values_list(
        "cluster_id", "namespace", "raw"
    ):
        existing.setdefault((cluster_id, namespace), []).append({**raw, "kind": "ResourceClaim"})
    pod_raw = dict(Pod.objects.filter(pk__in=[p.pk for p in pods]).values_list("pk", "raw"))
    out = []
    for pod in pods:
        raw = {**pod_raw[pod.pk], "kind": "Pod"}
        where = (pod.cluster_id, pod.namespace)
        objs = [raw, *events.get(pod.uid, []), *templates.get(where, []), *existing.get(where, [])]
        state = FleetState.from_objects(objs, cluster=pod.cluster.name)
        result = diagnose(state, raw).as_dict()
        out.append(
            Pending(
                cluster=pod.cluster.name,
                namespace=pod.namespace,
                name=pod.name,
                since=pod.created_at or pod.synced_at,
                result=_redacted(result, vis, pod.cluster.name),
                kind="pod",
                pods=(pod.name,),
                ref=pod.pk,
            )
        )
    return out


def with_age(items: list[Pending], query: PendingQuery, now: datetime | None = None) -> list[Pending]:
    """``items`` passing the query's cause and age filters."""
    now = now or timezone.now()
    return [i for i in items if query.keeps(i, now)]


def cluster_names() -> list[str]:
    return list(Cluster.objects.order_by("name").values_list("name", flat=True))


def visible_namespaces(vis: Visibility, cluster: str = "") -> list[str]:
    """Namespaces with a pending claim or a waiting pod that ``vis`` allows (the filter's choices)."""
    scope = Q(cluster__name=cluster) if cluster else Q()
    claims = ResourceClaim.objects.filter(vis.q(), scope, state="pending").values_list("namespace", flat=True)
    pods = (
        Pod.objects.filter(vis.q(), scope, node_name="")
        .exclude(claim_refs=[])
        .values_list("namespace", flat=True)
    )
    return sorted(set(claims.distinct()) | set(pods.distinct()))


# ------------------------------------------------------------------------------------- one claim's page


@dataclass
class ClaimDiagnosisPage:
    """What the claim diagnosis page shows: the claim, our diagnosis, and the scheduler's own words."""

    cluster: Cluster
    claim: ResourceClaim
    result: dict[str, Any] | None
    computed_at: datetime | None
    stored: bool
    pods: list[Pod]
    events: list[SchedulingEvent]


def claim_for_diagnosis(vis: Visibility, cluster: str, namespace: str, name: str) -> ResourceClaim | None:
    """The claim, or None when it does not exist *or* ``vis`` hides its namespace (callers answer 404)."""
    if not vis.allows(cluster, namespace):
        return None
    return (
        ResourceClaim.objects.filter(cluster__name=cluster, namespace=namespace, name=name)
        .select_related("cluster")
        .first()
    )


def pods_using(claim: ResourceClaim) -> QuerySet[PodClaimUse]:
    """The uses of ``claim`` by pods (directly or through a template), as stored by ingest."""
    return PodClaimUse.objects.filter(
        cluster_id=claim.cluster_id, namespace=claim.namespace, claim_name=claim.name
    )


def diagnose_now(claim: ResourceClaim) -> dict[str, Any]:
    """The diagnosis of ``claim`` computed now on its cluster's fleet, and not stored: the diagnosis task
    (``claims.tasks``) is the one writer of ClaimDiagnosis, so a read that finds no stored row answers with a
    fresh result and leaves the table as it was."""
    with FleetState.from_db(claim.cluster.name, lean=True) as state:  # the claim is its own stored row
        return diagnose(state, {**claim.raw, "kind": "ResourceClaim"}).as_dict()


def stored_diagnosis(claim: ResourceClaim) -> ClaimDiagnosis | None:
    """The stored diagnosis of ``claim`` with what reading it reads (its shape, and the claim's names)."""
    stored = ClaimDiagnosis.objects.filter(claim=claim).select_related("shape").first()
    if stored is not None:
        ClaimDiagnosis.claim.field.set_cached_value(stored, claim)
    return stored


def diagnosis_page(vis: Visibility, claim: ResourceClaim) -> ClaimDiagnosisPage:
    """The stored diagnosis (computed now, not stored, when a pending claim has none yet: the task owns the
    table), the claim's pods and their scheduling events, newest first."""
    cluster = claim.cluster
    stored = stored_diagnosis(claim)
    result: dict[str, Any] | None
    if stored is not None:
        result, computed_at = stored.result, stored.computed_at
    elif claim.state == "pending":
        result, computed_at = diagnose_now(claim), timezone.now()
    else:
        result, computed_at = None, None
    pods = list(
        Pod.objects.filter(vis.q(), cluster=cluster, namespace=claim.namespace)
        .filter(uid__in=pods_using(claim).values("pod_uid"))
        .order_by("name")
    )
    uids = [claim.uid, *(p.uid for p in pods)]
    events = list(
        SchedulingEvent.objects.filter(vis.q(), cluster=cluster, involved_uid__in=uids).order_by("-last_at")[
            :50
        ]
    )
    return ClaimDiagnosisPage(
        cluster=cluster,
        claim=claim,
        result=_redacted(result, vis, cluster.name),
        computed_at=computed_at,
        stored=stored is not None,
        pods=pods,
        events=events,
    )
