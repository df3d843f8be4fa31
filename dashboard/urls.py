"""Routes of the app, mounted by ``completions_site/urls.py``.

- ``admin_urlpatterns``: ``/admin/dashboard/...``, staff only through ``admin.site.admin_view``;
  they come before the admin's own routes, so ``/admin/dashboard/`` (otherwise this app's index
  in the admin) is the dashboard.
- ``account_urlpatterns``: ``/account/...``, the signed-in user's own account.
"""
from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.urls import include, path

from . import admin_views, views

_staff = admin.site.admin_view
_admin = [
    path("", _staff(admin_views.dashboard), name="index"),
    path("export.csv", _staff(admin_views.export_csv), name="export"),
    path("accounts/", _staff(admin_views.accounts), name="accounts"),
    path("accounts/<int:user_id>/", _staff(views.overview), name="account-overview"),
    path("accounts/<int:user_id>/keys/create/", _staff(views.create_key), name="account-create-key"),
    path("accounts/<int:user_id>/keys/<int:pk>/revoke/", _staff(views.revoke_key), name="account-revoke-key"),
]
admin_urlpatterns = [path("admin/dashboard/", include((_admin, "dashboard")))]

_account = [
    path("", login_required(views.overview), name="overview"),
    path("keys/create/", login_required(views.create_key), name="create-key"),
    path("keys/<int:pk>/revoke/", login_required(views.revoke_key), name="revoke-key"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("signup/", views.signup, name="signup"),
]
account_urlpatterns = [path("account/", include((_account, "account")))]
