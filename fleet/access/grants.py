"""The one writer of namespace grants and Kubernetes identities besides the admin: what single sign-on says
about a user at each login (``dashboard.oidc``), made true in one transaction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import transaction

from fleet.models import Cluster, KubeIdentity, NamespaceGrant


def sync_grants(user: Any, pairs: list[tuple[str | None, str]]) -> None:
    """Make ``user``'s namespace grants exactly ``pairs`` (clusters named but unknown are skipped)."""
    clusters = dict(Cluster.objects.values_list("name", "id"))
    wanted = {(clusters[c] if c else None, ns) for c, ns in pairs if c is None or c in clusters}
    with transaction.atomic():
        current = {(g.cluster_id, g.namespace): g for g in NamespaceGrant.objects.filter(user=user)}
        for key, grant in current.items():
            if key not in wanted:
                grant.delete()
        for cluster_id, namespace in wanted - set(current):
            NamespaceGrant.objects.create(user=user, cluster_id=cluster_id, namespace=namespace)


def sync_kube_identity(user: Any, claims: Mapping[str, Any]) -> None:
    """Store the username and groups a cluster's API server derives from this user's OIDC token (its
    ``--oidc-username-claim``/``-prefix`` and ``--oidc-groups-claim``/``-prefix``, mirrored by the
    ``CLAIMSCOPE_RBAC_*`` settings): RBAC visibility asks the clusters about this identity."""
    username = str(claims.get(settings.CLAIMSCOPE_RBAC_USERNAME_CLAIM) or "")
    raw_groups = claims.get(settings.CLAIMSCOPE_RBAC_GROUPS_CLAIM) or []
    groups = [raw_groups] if isinstance(raw_groups, str) else [str(g) for g in raw_groups if g]
    if not username:
        KubeIdentity.objects.filter(user=user).delete()
        return
    prefix = settings.CLAIMSCOPE_RBAC_GROUPS_PREFIX
    KubeIdentity.objects.update_or_create(
        user=user,
        defaults={
            "username": (settings.CLAIMSCOPE_RBAC_USERNAME_PREFIX + username)[:253],
            "groups": sorted(prefix + g for g in groups),
        },
    )
