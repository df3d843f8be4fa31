"""Routes of the app, mounted by ``completions_site/urls.py``.

``admin_routes``: ``/admin/dashboard/...``, staff only through ``admin.site.admin_view``.  The
project mounts them, with the accounts app's ``staff_routes``, under ``/admin/dashboard/`` in the
namespace ``dashboard``, before the admin's own routes, so ``/admin/dashboard/`` (otherwise this
app's index in the admin) is the dashboard.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import admin_views

_staff = admin.site.admin_view
admin_routes = [
    path("", _staff(admin_views.dashboard), name="index"),
    path("export.csv", _staff(admin_views.export_csv), name="export"),
    path("accounts/", _staff(admin_views.accounts), name="accounts"),
]
