"""Visibility from Kubernetes RBAC (``CLAIMSCOPE_VISIBILITY=kubernetes``).

In a cluster that shares the single-sign-on identity (its API server accepts the same OIDC tokens), a user
may see the namespaces where that cluster's own RBAC lets the user's identity (``fleet.KubeIdentity``:
username and groups, as the API server would derive them) ``list resourceclaims``. claimscope asks the
cluster with a SubjectAccessReview through its own credentials, which need ``create
subjectaccessreviews`` and nothing more: once cluster-wide (namespace ""), then per namespace claimscope
holds claims, pods or events of. Answers are cached for ``CLAIMSCOPE_RBAC_CACHE_SECONDS`` (default 30),
so a removed RoleBinding hides its namespace within that time. An unreachable cluster shows nothing (the
failure is logged), never everything.

Clusters listed in ``CLAIMSCOPE_RBAC_CLUSTERS`` (default: every configured one) use RBAC; the others keep
namespace grants (``fleet.NamespaceGrant``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable

from django.conf import settings
from django.core.cache import cache

from fleet import clusters
from fleet.kube.kubesource import KubeSource
from fleet.kube.source import SourceError
from fleet.models import Pod, ResourceClaim, SchedulingEvent

log = logging.getLogger("claimscope.security")

REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
EVERY_NAMESPACE = "*"
_sources: dict[str, KubeSource] = {}
_lock = threading.Lock()


def rbac_clusters() -> set[str]:
    """The cluster names whose RBAC decides visibility."""
    named = set(settings.CLAIMSCOPE_RBAC_CLUSTERS)
    return named or {c.name for c in clusters.configured()}


def _source(cluster: str) -> KubeSource:
    with _lock:
        source = _sources.get(cluster)
        config = clusters.get(cluster)
        if source is None or getattr(source, "_claimscope_config", None) != config:
            source = config.source()
            source._claimscope_config = config  # type: ignore[attr-defined]
            _sources[cluster] = source
        return source


def allowed(source: KubeSource, username: str, groups: Iterable[str], namespace: str) -> bool:
    """Whether ``username`` (with ``groups``) may list ResourceClaims in ``namespace`` ("" = all of them)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": username,
            "groups": sorted(groups),
            "resourceAttributes": {
                "namespace": namespace,
                "verb": "list",
                "group": "resource.k8s.io",
                "resource": "resourceclaims",
            },
        },
    }
    return bool(source.post(REVIEWS, review).get("status", {}).get("allowed"))


# Other apps' namespaced tables (the claims history keeps namespaces of deleted claims), added at app load:
# the mirror asks them without importing them.
NAMESPACE_SOURCES: list[Callable[[str], Iterable[str]]] = []


def add_namespace_source(source: Callable[[str], Iterable[str]]) -> None:
    """Also offer the namespaces ``source(cluster name)`` returns to the RBAC question."""
    if source not in NAMESPACE_SOURCES:
        NAMESPACE_SOURCES.append(source)


def known_namespaces(cluster: str) -> set[str]:
    """The namespaces of a cluster claimscope holds anything namespaced of."""
    out: set[str] = set()
    for model in (ResourceClaim, Pod, SchedulingEvent):
        rows = model.objects.filter(cluster__name=cluster)
        out.update(rows.values_list("namespace", flat=True).distinct())
    for source in NAMESPACE_SOURCES:
        out.update(source(cluster))
    return out


def visible_namespaces(cluster: str, username: str, groups: list[str]) -> set[str]:
    """The namespaces of ``cluster`` the identity may see: ``{"*"}`` for all of them."""
    key = "rbac-vis:" + hashlib.sha256(repr((cluster, username, sorted(groups))).encode()).hexdigest()
    cached = cache.get(key)
    if isinstance(cached, set):
        return cached
    try:
        source = _source(cluster)
        if allowed(source, username, groups, ""):
            result = {EVERY_NAMESPACE}
        else:
            result = {ns for ns in sorted(known_namespaces(cluster)) if allowed(source, username, groups, ns)}
    except (SourceError, clusters.ClusterConfigError, ValueError) as exc:
        log.warning("visibility: cannot ask cluster %s about user=%r: %s", cluster, username, exc)
        return set()
    cache.set(key, result, settings.CLAIMSCOPE_RBAC_CACHE_SECONDS)
    return result
