"""Routes of the app, mounted by ``completions_site/urls.py``.

- ``account_urlpatterns``: ``/account/...``, the signed-in user's own account (namespace ``account``).
- ``staff_routes``: the same pages for staff acting for a user, mounted by the project under
  ``/admin/dashboard/accounts/<user_id>/`` in the dashboard's namespace (``dashboard:account-*``),
  each behind ``admin.site.admin_view``.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.urls import include, path

from . import views

_staff = admin.site.admin_view
staff_routes = [
    path("accounts/<int:user_id>/", _staff(views.overview), name="account-overview"),
    path("accounts/<int:user_id>/keys/create/", _staff(views.create_key), name="account-create-key"),
    path("accounts/<int:user_id>/keys/<int:pk>/revoke/", _staff(views.revoke_key), name="account-revoke-key"),
]

_account = [
    path("", login_required(views.overview), name="overview"),
    path("keys/create/", login_required(views.create_key), name="create-key"),
    path("keys/<int:pk>/revoke/", login_required(views.revoke_key), name="revoke-key"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("signup/", views.signup, name="signup"),
]
account_urlpatterns = [path("account/", include((_account, "account")))]
