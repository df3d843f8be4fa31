"""URL routes: the OpenAI-compatible API under /v1 (api/), the health check, and the admin."""

from django.contrib import admin
from django.urls import path, re_path

from api import usage_views, views
from completions_site import metrics

urlpatterns = [
    path("v1/usage/completions", usage_views.usage_completions, name="usage-completions"),
    path("v1/costs", usage_views.costs, name="costs"),
    path("v1/completions", views.completions, name="completions"),
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    path("v1/models", views.models, name="models"),
    path("v1/models/<path:model>", views.model_detail, name="model-detail"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("admin/", admin.site.urls),
]

# --- The staff dashboard under /admin/dashboard/ (before the admin's own routes), with the account
# pages staff open for a user in the same namespace; the users' own /account/.
from django.urls import include  # noqa: E402

from accounts.urls import account_urlpatterns, staff_routes  # noqa: E402
from dashboard.urls import admin_routes  # noqa: E402
from organization.urls import organization_urlpatterns  # noqa: E402

admin_urlpatterns = [path("admin/dashboard/", include(([*admin_routes, *staff_routes], "dashboard")))]
urlpatterns = [*admin_urlpatterns, *account_urlpatterns, *organization_urlpatterns, *urlpatterns]

# Any other /v1 URL gets OpenAI's JSON 404, after every real /v1 route above.
urlpatterns.append(re_path(r"^v1/(?P<path>[\s\S]*)$", views.not_found))  # newlines too

# Errors Django raises before any view answers (a 400 for too many fields, an uncaught 500) are
# OpenAI's JSON on the API's paths.
handler400 = views.bad_request
handler500 = views.server_error
