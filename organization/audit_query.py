"""The audit log's filters: OpenAI's ``list-audit-logs`` query, checked like every other query.

Served at ``GET /v1/organization/audit_logs`` (``organization.views.AuditLogViewSet``); the
entries are the audit app's (``audit/``).  Paging (``limit``, ``after``, ``before``) is the
Administration API's one pagination class's (``organization.pagination``); this module reads the
filters:

- ``event_types[]``: any of :data:`audit.models.EVENT_TYPES` (another value is a 400
  ``invalid_value``; we record no other type).
- ``effective_at[gt]``, ``[gte]``, ``[lt]``, ``[lte]``: Unix seconds.
- ``actor_ids[]``: ``user_…`` (a session's person), an admin key's ``key_…``, or ``system``.
- ``resource_ids[]``: ``key_…`` or ``user_…`` (``keys.ids``).

Arrays may be repeated, bracketed or comma-separated (``api.query``).  Errors are OpenAI's 400s
naming the parameter, e.g. ``effective_at[gt]=x`` is ``invalid_type`` with ``param``
``effective_at.gt``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from django.db.models import QuerySet
from django.http import QueryDict
from jsonschema import Draft202012Validator

from api.query import query_instance, validate_query
from audit.models import EVENT_TYPES, AuditLogEntry

_TIME = {"type": "integer", "minimum": 0, "maximum": 253_370_764_799}
_IDS = {"type": "array", "items": {"type": "string"}}
QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event_types": {"type": "array", "items": {"type": "string", "enum": list(EVENT_TYPES)}},
        "effective_at": {"type": "object", "properties": {name: _TIME for name in ("gt", "gte", "lt", "lte")}},
        "actor_ids": _IDS,
        "resource_ids": _IDS,
    },
}
_VALIDATOR = Draft202012Validator(QUERY_SCHEMA)
# effective_at is shown in whole seconds (truncated), so "shown > T" is "at or after T + 1" and
# "shown <= T" is "before T + 1": each bound becomes a lookup and the second it starts at.
_BOUNDS = {"gt": ("gte", 1), "gte": ("gte", 0), "lt": ("lt", 0), "lte": ("lt", 1)}


def audit_filters(params: QueryDict) -> dict[str, Any]:
    """The queryset filters ``params`` ask for (see the module docstring); ``APIError`` 400 naming
    the parameter."""
    query = query_instance(params, QUERY_SCHEMA)
    validate_query(query, _VALIDATOR)
    filters: dict[str, Any] = {}
    if "event_types" in query:
        filters["type__in"] = query["event_types"]
    if "actor_ids" in query:
        filters["actor_id__in"] = query["actor_ids"]
    if "resource_ids" in query:
        filters["resource_id__in"] = query["resource_ids"]
    for bound, seconds in query.get("effective_at", {}).items():
        lookup, shift = _BOUNDS[bound]
        moment = datetime.fromtimestamp(seconds + shift, timezone.utc)
        key = f"effective_at__{lookup}"
        if key in filters:  # gt with gte, or lt with lte: the narrower bound holds
            moment = max(filters[key], moment) if lookup == "gte" else min(filters[key], moment)
        filters[key] = moment
    return filters


def filtered(queryset: QuerySet[AuditLogEntry], params: QueryDict) -> QuerySet[AuditLogEntry]:
    """``queryset`` narrowed by the filters in ``params`` (not yet paged)."""
    return queryset.filter(**audit_filters(params))
