"""The audit log in the Django admin: read-only, newest first, filterable by type and actor."""

from __future__ import annotations

from django.contrib import admin

from keys.admin import ReadOnlyModelAdmin

from .models import AuditLogEntry


@admin.register(AuditLogEntry)
class AuditLogEntryAdmin(ReadOnlyModelAdmin):
    """Entries are evidence: viewable, never added, changed or deleted here."""

    list_display = ("effective_at", "type", "actor_type", "actor_id", "resource_id", "public_id")
    list_filter = ("type", "actor_type", "effective_at")
    date_hierarchy = "effective_at"
    search_fields = ("public_id", "actor_id", "resource_id")
    readonly_fields = ("public_id", "type", "effective_at", "actor_type", "actor_id", "actor", "resource_id", "details")
