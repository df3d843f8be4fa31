"""drf-spectacular's view of our own classes: the admin-key scheme and the constant ``object`` fields.

Loaded by ``OrganizationConfig.ready`` (drf-spectacular finds extensions by subclassing).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension


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
