"""Admin for namespace grants: who may see the claims, pods and events of which namespaces.

The mirrored Kubernetes tables are not edited here (``fleet.ingest`` is their only writer).
"""

from __future__ import annotations

from django.contrib import admin

from fleet.models import KubeIdentity, NamespaceGrant


@admin.register(NamespaceGrant)
class NamespaceGrantAdmin(admin.ModelAdmin):
    list_display = ("user", "cluster", "namespace")
    list_filter = ("cluster",)
    search_fields = ("user__username", "namespace")
    autocomplete_fields = ("user",)
    ordering = ("user__username", "namespace")


@admin.register(KubeIdentity)
class KubeIdentityAdmin(admin.ModelAdmin):
    """Written at each SSO login (dashboard.oidc); shown so operators can check what RBAC is asked about."""

    list_display = ("user", "username", "groups", "updated_at")
    search_fields = ("user__username", "username")
    readonly_fields = ("user", "username", "groups", "updated_at")
