"""drf-spectacular's view of our own classes: the admin-key scheme and the constant ``object`` fields.

Loaded by ``OrganizationConfig.ready`` (drf-spectacular finds extensions by subclassing).
"""

from __future__ import annotations

import threading
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.views import SpectacularJSONAPIView
from rest_framework.response import Response


class AdminKeyScheme(OpenApiAuthenticationExtension):
    """``AdminKeyAuthentication`` as the spec's ``AdminApiKeyAuth``: HTTP Bearer."""

    target_class = "organization.authentication.AdminKeyAuthentication"
    name = "AdminApiKeyAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer", "description": "An admin key, sk-cs-admin-..."}


class ConstFieldSchema(OpenApiSerializerFieldExtension):
    """A ``ConstField`` inline as ``{"type": "string", "enum": [value]}``, as the spec writes ``object``."""

    target_class = "organization.serializers.ConstField"

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        return {"type": "string", "enum": [self.target.value]}


class CachedSchemaView(SpectacularJSONAPIView):
    """``GET /v1/organization/openapi.json``: the schema, generated once per process.

    The route needs no key, and a generation takes the server process's CPU from the engine:
    generated per request, a few clients looping on it slowed every other request
    (docs/performance.md#keys-usage-records-and-the-database).  The schema comes from the code, so it
    cannot change while the process runs.  The version is the settings' (``?version=`` would
    otherwise be a new schema, and cache entry, per value).
    """

    api_version = spectacular_settings.VERSION
    _schema: dict[str, Any] | None = None
    _lock = threading.Lock()

    def _get_schema_response(self, request: Any) -> Response:
        cls = type(self)
        if cls._schema is None:
            with cls._lock:
                if cls._schema is None:
                    cls._schema = super()._get_schema_response(request).data
        return Response(
            data=cls._schema,
            headers={"Content-Disposition": f'inline; filename="{self._get_filename(request, self.api_version)}"'},
        )
