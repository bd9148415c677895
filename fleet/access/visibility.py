"""Namespace-scoped visibility: which claims, pods and events a user may see.

Secure by default: superusers and holders of the ``fleet.view_all_namespaces`` permission see every
namespace; every other user sees only the namespaces granted to them (``fleet.NamespaceGrant`` rows, edited
in the admin; a grant without a cluster covers that namespace in every cluster). A user with no grant sees
no claim, pod or event at all.

Fleet-wide device counts (overview, summary, heatmap values, MIG slots, history) stay visible to every
logged-in user. What is hidden is the identity of foreign claims, pods and events: names, namespaces, specs,
messages. A device held by a foreign claim still shows as held, by a :func:`hidden_holder` (empty namespace
and name) ("allocated — another namespace").

Use :func:`visibility_for` once per request or connection, then ``vis.q()`` on querysets and
``vis.allows()`` / :func:`redact_holders` on data already loaded. Views answer 404 (never 403) for a foreign
object, so its existence is not confirmed.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from django.conf import settings
from django.db.models import Q

from fleet.models import Cluster, KubeIdentity, NamespaceGrant
from fleet.selectors import DeviceKey, Holder

ALL_CLUSTERS = "*"
VIEW_ALL_PERMISSION = "fleet.view_all_namespaces"
HIDDEN_LABEL = "allocated — another namespace"
HIDDEN_REF = "a claim in another namespace"
_CACHE_ATTR = "_claimscope_visibility"

K = TypeVar("K")


@dataclass(frozen=True)
class Visibility:
    """What one user may see: everything, or the listed ``(cluster name or "*", namespace)`` pairs and every
    namespace of the ``clusters`` listed (Kubernetes RBAC granting a whole cluster)."""

    all_namespaces: bool
    namespaces: frozenset[tuple[str, str]]
    clusters: frozenset[str] = frozenset()

    @classmethod
    def everything(cls) -> Visibility:
        return cls(True, frozenset())

    @classmethod
    def nothing(cls) -> Visibility:
        return cls(False, frozenset())

    def allows(self, cluster: str, namespace: str) -> bool:
        """Whether objects in ``namespace`` of the cluster named ``cluster`` are visible."""
        if self.all_namespaces or cluster in self.clusters:
            return True
        return (cluster, namespace) in self.namespaces or (ALL_CLUSTERS, namespace) in self.namespaces

    def q(self, cluster_field: str = "cluster__name", namespace_field: str = "namespace") -> Q:
        """A queryset filter keeping only visible rows; ``Q()`` when everything is visible.

        ``cluster_field`` compares with a cluster *name* (``cluster__name``, ``claim__cluster__name``...).
        """
        if self.all_namespaces:
            return Q()
        # A filter that matches nothing, on a field every caller has (``pk__in=[]`` would name the wrong
        # model when the fields are on a related one).
        out = Q(**{f"{namespace_field}__in": []})
        by_cluster: dict[str, set[str]] = defaultdict(set)
        for cluster, namespace in self.namespaces:
            by_cluster[cluster].add(namespace)
        for cluster, names in sorted(by_cluster.items()):
            part = Q(**{f"{namespace_field}__in": sorted(names)})
            if cluster != ALL_CLUSTERS:
                part &= Q(**{cluster_field: cluster})
            out |= part
        if self.clusters:
            out |= Q(**{f"{cluster_field}__in": sorted(self.clusters)})
        return out

    @property
    def restricted(self) -> bool:
        return not self.all_namespaces


def visibility_for(user: Any) -> Visibility:
    """The visibility of ``user`` (anonymous or inactive users see nothing). Cached on the user object, so a
    request or a websocket connection asks the database once. Synchronous: call it from async code through
    ``database_sync_to_async``."""
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", True):
        return Visibility.nothing()
    cached = getattr(user, _CACHE_ATTR, None)
    if isinstance(cached, Visibility):
        return cached
    if user.is_superuser or user.has_perm(VIEW_ALL_PERMISSION):
        vis = Visibility.everything()
    elif settings.CLAIMSCOPE_VISIBILITY == "kubernetes":
        vis = _from_kubernetes(user)
    else:
        pairs = NamespaceGrant.objects.filter(user_id=user.pk).values_list("cluster__name", "namespace")
        vis = Visibility(
            False, frozenset((cluster or ALL_CLUSTERS, namespace) for cluster, namespace in pairs)
        )
    with contextlib.suppress(AttributeError):  # a user object refusing attributes: no cache, still correct
        setattr(user, _CACHE_ATTR, vis)
    return vis


def _from_kubernetes(user: Any) -> Visibility:
    """RBAC-decided namespaces in the clusters sharing the SSO identity (fleet.access.kube_rbac); namespace
    grants in the others (a grant for every cluster covers only those)."""
    from fleet.access import kube_rbac

    rbac = kube_rbac.rbac_clusters()
    others = set(Cluster.objects.values_list("name", flat=True)) - rbac
    pairs: set[tuple[str, str]] = set()
    grants = NamespaceGrant.objects.filter(user_id=user.pk).values_list("cluster__name", "namespace")
    for cluster, namespace in grants:
        names = others if cluster is None else ({cluster} & others)
        pairs.update((name, namespace) for name in names)
    whole: set[str] = set()
    identity = KubeIdentity.objects.filter(user_id=user.pk).first()
    if identity is not None:
        for cluster in sorted(rbac):
            namespaces = kube_rbac.visible_namespaces(cluster, identity.username, list(identity.groups))
            if kube_rbac.EVERY_NAMESPACE in namespaces:
                whole.add(cluster)
            pairs.update((cluster, namespace) for namespace in namespaces)
    return Visibility(False, frozenset(pairs), frozenset(whole))


def forget(user: Any) -> None:
    """Drop the cached visibility (after grants change during a long-lived connection or a test)."""
    if hasattr(user, _CACHE_ATTR):
        delattr(user, _CACHE_ATTR)


def grant_all_namespaces(user: Any) -> None:
    """Give ``user`` the ``fleet.view_all_namespaces`` permission: the demo user (``demo_login``) and the
    test users of the suites that are not about visibility. Precondition: migrations ran (the permission
    row exists)."""
    from django.contrib.auth.models import Permission

    app_label, codename = VIEW_ALL_PERMISSION.split(".")
    user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    # ModelBackend caches permissions on the object: drop the caches so the same object sees the grant.
    for attr in ("_perm_cache", "_user_perm_cache", "_group_perm_cache", _CACHE_ATTR):
        if hasattr(user, attr):
            delattr(user, attr)


# ---------------------------------------------------------------------------------------------- helpers


def hidden_holder(holder: Holder) -> Holder:
    """The same holding, without its identity: the state stays (it is drawn as a flag on the heatmap)."""
    return replace(holder, namespace="", name="", consumers=())


def is_hidden(holder: Holder) -> bool:
    return not holder.name


def redact_holders(
    holders: Mapping[K, list[Holder]], vis: Visibility, cluster_names: Mapping[int, str]
) -> dict[K, list[Holder]]:
    """``selectors.allocation_holders`` output with foreign claims replaced by :func:`hidden_holder`.

    Keys are device keys whose first item is the cluster id; ``cluster_names`` maps ids to names.
    Devices keep their holders (and so their counts and states); only the identity goes. One foreign claim
    becomes one hidden object wherever it holds devices, so callers can count claims by object identity.
    """
    if vis.all_namespaces:
        return dict(holders)
    out: dict[K, list[Holder]] = {}
    hidden: dict[tuple[str, str, str], Holder] = {}
    for key, held in holders.items():
        cluster = cluster_names.get(key[0], "") if isinstance(key, tuple) else ""
        row = []
        for h in held:
            if vis.allows(cluster, h.namespace):
                row.append(h)
            else:
                row.append(hidden.setdefault((cluster, h.namespace, h.name), hidden_holder(h)))
        out[key] = row
    return out


def redact_claim_refs(
    refs: Iterable[str], vis: Visibility, cluster: str, hidden: str = HIDDEN_LABEL
) -> list[str]:
    """``"namespace/name"`` strings with the foreign ones replaced by ``hidden`` (duplicates kept: counts
    stay right)."""
    out = []
    for ref in refs:
        namespace = ref.split("/", 1)[0]
        out.append(ref if vis.allows(cluster, namespace) else hidden)
    return out


def redact_heatmap_rows(rows: dict[str, list[Any]], vis: Visibility) -> dict[str, list[Any]]:
    """Heatmap rows (``fleet.heatmap`` shape) safe for ``vis``.

    Today a cell carries only the *number* of claims holding the GPU (a device count, visible to all), so
    rows pass unchanged. Should a cell ever carry claim references (lists of ``"namespace/name"`` strings
    or ``[namespace, name]`` pairs in the fifth cell field), the foreign ones are replaced here. Returns the
    input object itself when nothing changes, so a snapshot shared between connections is not copied.
    """
    if vis.all_namespaces:
        return rows
    out: dict[str, list[Any]] | None = None
    for key, row in rows.items():
        cells = row[4]
        new_cells = None
        for i, cell in enumerate(cells):
            claims = cell[4] if len(cell) > 4 else None
            if not isinstance(claims, list):
                continue
            safe = [_redact_ref(ref, vis, str(row[0])) for ref in claims]
            if safe != claims:
                if new_cells is None:
                    new_cells = list(cells)
                new_cells[i] = [*cell[:4], safe, *cell[5:]]
        if new_cells is not None:
            if out is None:
                out = dict(rows)
            out[key] = [*row[:4], new_cells, *row[5:]]
    return rows if out is None else out


def _redact_ref(ref: Any, vis: Visibility, cluster: str) -> Any:
    if isinstance(ref, str) and "/" in ref:
        return ref if vis.allows(cluster, ref.split("/", 1)[0]) else HIDDEN_LABEL
    if isinstance(ref, (list, tuple)) and len(ref) >= 2:
        return ref if vis.allows(cluster, str(ref[0])) else HIDDEN_LABEL
    return ref


# ``namespace/name`` inside free text (diagnosis summaries name the claims holding devices). A namespace is
# a DNS label (no dots), so ``gpu.nvidia.com/...`` and the pool/device parts of ``driver/pool/device`` do
# not match: the lookbehind refuses a token glued to a dot, a slash or a word character. A number before
# the slash is a ratio ("0/1 nodes are available", "3/7 slices"), never a namespace in practice (the API
# server would accept "0" as one, but no fleet names its teams that way).
_REF = re.compile(
    r"(?<![\w./-])(?![0-9]+/)([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)/([a-z0-9](?:[-.a-z0-9]{0,251}[a-z0-9])?)"
)
# Slash-separated words of kube-scheduler messages that only look like references ("3 node(s) didn't
# match Pod's node affinity/selector"): kept, so the scheduler's words reach a restricted user intact.
_NOT_REFS = frozenset({"affinity/selector"})


def redact_text(text: str, vis: Visibility, cluster: str) -> str:
    """``text`` with every ``namespace/name`` of a namespace ``vis`` does not allow replaced by
    "a claim in another namespace". May over-hide a slash-separated word that only looks like a reference."""
    if vis.all_namespaces:
        return text
    return redact_text_for(text, vis.allows, cluster)


def redact_text_for(text: str, allows: Callable[[str, str], bool], cluster: str) -> str:
    """:func:`redact_text` for code that holds an ``allows(cluster, namespace)`` callable."""
    if "/" not in text:
        return text
    return _REF.sub(lambda m: m[0] if m[0] in _NOT_REFS or allows(cluster, m[1]) else HIDDEN_REF, text)


def redact_diagnosis(result: Any, vis: Visibility, cluster: str) -> Any:
    """A diagnosis result (``claims.diagnosis.Diagnosis.as_dict()``, or any part of it) safe for ``vis``:
    holder entries of foreign claims lose their name and pods, and every string has foreign
    ``namespace/name`` references replaced (summaries and suggestions name holders)."""
    if vis.all_namespaces:
        return result
    if isinstance(result, str):
        return redact_text(result, vis, cluster)
    if isinstance(result, list):
        return [redact_diagnosis(v, vis, cluster) for v in result]
    if isinstance(result, dict):
        out = {k: redact_diagnosis(v, vis, cluster) for k, v in result.items()}
        claim = result.get("claim")
        if "pods" in result and isinstance(claim, str) and not vis.allows(cluster, claim.split("/", 1)[0]):
            out["claim"] = HIDDEN_REF
            out["pods"] = []
        return out
    return result


def device_keys_cluster_names(keys: Iterable[DeviceKey]) -> dict[int, str]:
    """Cluster names for the cluster ids in device keys (one query)."""
    from fleet.models import Cluster

    ids = {k[0] for k in keys}
    return dict(Cluster.objects.filter(pk__in=ids).values_list("id", "name")) if ids else {}
