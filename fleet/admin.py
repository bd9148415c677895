"""Admin for API tokens (staff see and revoke them; keys are never shown, only stored as digests) and the
audit trail (read-only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from fleet.models import ApiToken, AuditEvent


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "prefix", "created_at", "expires_at", "last_used_at")
    search_fields = ("user__username", "prefix")
    readonly_fields = ("user", "prefix", "created_at", "expires_at", "last_used_at")
    exclude = ("digest",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a key is shown once, to its owner, on the token page


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ("at", "action", "username", "ip", "detail")
    list_filter = ("action",)
    search_fields = ("username", "ip")
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
