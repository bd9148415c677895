"""Admin for namespace grants: who may see the claims, pods and events of which namespaces.

The mirrored Kubernetes tables are not edited here (``fleet.ingest`` is their only writer).
"""

from __future__ import annotations

from django.contrib import admin

from claims.models import NamespaceGrant


@admin.register(NamespaceGrant)
class NamespaceGrantAdmin(admin.ModelAdmin):
    list_display = ("user", "cluster", "namespace")
    list_filter = ("cluster",)
    search_fields = ("user__username", "namespace")
    autocomplete_fields = ("user",)
    ordering = ("user__username", "namespace")
