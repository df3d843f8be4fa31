"""Admin keys in the Django admin: staff create one (shown once), see them, revoke them."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils.html import format_html

from .models import AdminAPIKey


@admin.register(AdminAPIKey)
class AdminAPIKeyAdmin(admin.ModelAdmin):
    """The add form asks name, owner (a staff user), scope and expiry; the secret is generated and shown
    once.  The scope cannot change afterwards: revoke the key and create another."""

    list_display = ("name", "owner", "prefix", "scope", "created_at", "last_used_at", "expires_at", "status")
    list_filter = ("scope",)
    list_select_related = ("owner",)
    search_fields = ("name", "prefix")
    actions = ("revoke_selected",)
    add_fields = ("name", "owner", "scope", "expires_at")
    change_fields = (
        "name", "owner", "prefix", "scope", "status", "created_at", "last_used_at", "expires_at", "revoked_at",
    )  # fmt: skip
    change_readonly_fields = ("owner", "prefix", "scope", "status", "created_at", "last_used_at", "revoked_at")

    def get_fields(self, request: HttpRequest, obj: AdminAPIKey | None = None) -> tuple[str, ...]:
        return self.add_fields if obj is None else self.change_fields

    def get_readonly_fields(self, request: HttpRequest, obj: AdminAPIKey | None = None) -> tuple[str, ...]:
        return () if obj is None else self.change_readonly_fields

    def get_changeform_initial_data(self, request: HttpRequest) -> dict:
        return {"owner": request.user.pk, **super().get_changeform_initial_data(request)}

    @admin.display(description="status")
    def status(self, obj: AdminAPIKey) -> str:
        return obj.status

    def save_model(self, request: HttpRequest, obj: AdminAPIKey, form: ModelForm, change: bool) -> None:
        """Generate and show the key once on add; a change saves only the editable fields."""
        if change:
            super().save_model(request, obj, form, change)
            return
        plaintext = AdminAPIKey.objects.issue(obj)
        messages.success(
            request,
            format_html(
                "The new admin key “{}” is <code>{}</code> — copy it now: it is not stored and will not be "
                "shown again.",
                obj.name,
                plaintext,
            ),
        )

    @admin.action(description="Revoke selected admin keys", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[AdminAPIKey]) -> None:
        """Revoke every selected key not revoked yet, logging each in the admin history."""
        revoked = [admin_key for admin_key in queryset if admin_key.revoke()]
        for admin_key in revoked:
            self.log_change(request, admin_key, "Revoked.")
        self.message_user(request, f"Revoked {len(revoked)} of {queryset.count()} selected keys.", messages.SUCCESS)
