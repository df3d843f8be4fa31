"""What every Administration API view shares: pluggable access, JSON only, OpenAI's error shape.

Access comes from two settings, read on each request (so tests and deployments can change them):
``ADMIN_API_AUTHENTICATION_CLASSES`` and ``ADMIN_API_PERMISSION_CLASSES``, dotted paths of DRF
authentication and permission classes.  The defaults let a staff member's admin session in
(``SessionAuthentication`` and ``IsAdminUser``) where the session middleware runs (Django's test
client); under daphne ``/v1/`` paths run without it (``api/handlers.py``), so there the defaults
admit nobody until the admin-key authentication of the Administration API takes their place.  A view (or ``as_view(...)``) that sets
``authentication_classes``/``permission_classes`` itself keeps its own.

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``: an ``api.errors.APIError``
as it is, DRF's authentication and permission errors as 401/403 (:func:`openai_exception_handler`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from .errors import APIError

DEFAULT_AUTHENTICATION_CLASSES = ["rest_framework.authentication.SessionAuthentication"]
DEFAULT_PERMISSION_CLASSES = ["rest_framework.permissions.IsAdminUser"]
_CODES = {
    exceptions.NotAuthenticated: "missing_admin_credentials",
    exceptions.AuthenticationFailed: "invalid_admin_credentials",
    exceptions.PermissionDenied: "insufficient_permissions",
}


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's exception handler in OpenAI's error shape; ``None`` (a 500) for what it does not know."""
    if isinstance(exc, APIError):
        return Response(exc.to_dict(), status=exc.status, headers=exc.headers)
    if isinstance(exc, exceptions.APIException):
        error = APIError(
            str(exc.detail) if not isinstance(exc.detail, (list, dict)) else exc.default_detail,
            status=exc.status_code,
            code=next((code for kind, code in _CODES.items() if isinstance(exc, kind)), exc.default_code),
        )
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        return Response(error.to_dict(), status=error.status, headers=headers)
    return None


class AdminAPIView(APIView):
    """Base of the Administration API's views: access from settings, JSON in and out, OpenAI's errors."""

    authentication_classes: Any = None
    permission_classes: Any = None
    renderer_classes = [JSONRenderer]

    def get_authenticators(self) -> list[Any]:
        classes = self.authentication_classes
        if classes is None:
            classes = [
                import_string(path)
                for path in getattr(settings, "ADMIN_API_AUTHENTICATION_CLASSES", DEFAULT_AUTHENTICATION_CLASSES)
            ]
        return [auth() for auth in classes]

    def get_permissions(self) -> list[Any]:
        classes = self.permission_classes
        if classes is None:
            classes = [
                import_string(path)
                for path in getattr(settings, "ADMIN_API_PERMISSION_CLASSES", DEFAULT_PERMISSION_CLASSES)
            ]
        return [permission() for permission in classes]

    def get_exception_handler(self) -> Any:
        return openai_exception_handler
