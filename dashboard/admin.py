"""The admin side of the app: the one row of account settings (self sign-up on or off).

The dashboard itself and the staff pages that act for a user are plain views mounted under
``/admin/dashboard/`` (see ``dashboard/urls.py``), linked from the admin index.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse

from .models import AccountSettings


@admin.register(AccountSettings)
class AccountSettingsAdmin(admin.ModelAdmin):
    """One row: the list goes straight to its change form; it is never added twice or deleted."""

    fields = ("self_signup",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AccountSettings | None = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponseRedirect:
        settings = AccountSettings.current()
        return HttpResponseRedirect(reverse("admin:dashboard_accountsettings_change", args=[settings.pk]))
