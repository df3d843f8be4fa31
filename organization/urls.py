"""The Administration API's routes under ``/v1/organization/`` (OpenAI's paths; POST modifies, as OpenAI's do).

Every route here is in the generated schema (``openapi.json``, the last route).
"""

from __future__ import annotations

from django.urls import path

from . import views
from .schema import CachedSchemaView

PREFIX = "v1/organization/"

organization_urlpatterns = [
    path(PREFIX + "admin_api_keys", views.AdminApiKeyViewSet.as_view({"get": "list", "post": "create"})),
    path(
        PREFIX + "admin_api_keys/<str:key_id>",
        views.AdminApiKeyViewSet.as_view({"get": "retrieve", "delete": "destroy"}),
    ),
    path(PREFIX + "users", views.UserViewSet.as_view({"get": "list", "post": "create"})),
    path(
        PREFIX + "users/<str:user_id>",
        views.UserViewSet.as_view({"get": "retrieve", "post": "update", "delete": "destroy"}),
    ),
    path(
        PREFIX + "users/<str:user_id>/limits",
        views.UserLimitsViewSet.as_view({"get": "retrieve", "post": "update"}),
    ),
    path(PREFIX + "model_prices", views.ModelPriceViewSet.as_view({"get": "list", "post": "create"})),
    path(
        PREFIX + "model_prices/<path:model>",
        views.ModelPriceViewSet.as_view({"get": "retrieve", "delete": "destroy"}),
    ),
    path(PREFIX + "costs", views.CostsViewSet.as_view({"get": "retrieve"}), name="organization-costs"),
    path(
        PREFIX + "projects/<str:project_id>/api_keys",
        views.ProjectApiKeyViewSet.as_view({"get": "list", "post": "create"}),
    ),
    path(
        PREFIX + "projects/<str:project_id>/api_keys/<str:api_key_id>",
        views.ProjectApiKeyViewSet.as_view({"get": "retrieve", "post": "update", "delete": "destroy"}),
    ),
    path(PREFIX + "projects/<str:project_id>/rate_limits", views.ProjectRateLimitViewSet.as_view({"get": "list"})),
    path(
        PREFIX + "projects/<str:project_id>/rate_limits/<str:rate_limit_id>",
        views.ProjectRateLimitViewSet.as_view({"post": "update"}),
    ),
    path(PREFIX + "audit_logs", views.AuditLogViewSet.as_view({"get": "list"}), name="organization-audit-logs"),
    path(
        PREFIX + "usage/completions",
        views.UsageCompletionsViewSet.as_view({"get": "retrieve"}),
        name="organization-usage-completions",
    ),
]

# The schema of the routes above, generated from the code, readable without a key.
organization_urlpatterns.append(
    path(
        PREFIX + "openapi.json",
        CachedSchemaView.as_view(
            patterns=list(organization_urlpatterns), authentication_classes=[], permission_classes=[]
        ),
        name="organization-openapi",
    )
)
