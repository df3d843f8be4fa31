"""The audit log API's protocol: OpenAI's ``list-audit-logs`` query, checked like every other query.

Served at ``GET /v1/organization/audit_logs`` (``api/audit_views.py``); the entries are the audit
app's (``audit/``).

- ``event_types[]``: any of :data:`audit.models.EVENT_TYPES` (another value is a 400
  ``invalid_value``; we record no other type).
- ``effective_at[gt]``, ``[gte]``, ``[lt]``, ``[lte]``: Unix seconds.
- ``actor_ids[]``: ``user-…`` (a session's person), an admin key's id, or ``system``.
- ``resource_ids[]``: ``key_…`` or ``user-…``.
- ``limit``: 1 to 100, default 20.
- ``after`` / ``before``: the ``id`` of an entry (``last_id`` / ``first_id`` of a page); not both.

Arrays may be repeated, bracketed or comma-separated (``api.query``).  Errors are OpenAI's 400s
naming the parameter, e.g. ``limit=0`` is ``integer_below_min_value`` and ``effective_at[gt]=x``
``invalid_type`` with ``param`` ``effective_at.gt``; a cursor that names no entry is
``invalid_value``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django.db.models import QuerySet
from django.http import QueryDict
from jsonschema import Draft202012Validator

from audit.models import EVENT_TYPES, AuditLogEntry

from .errors import invalid_value_error
from .query import query_instance, validate_query

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
_TIME = {"type": "integer", "minimum": 0, "maximum": 253_370_764_799}
_IDS = {"type": "array", "items": {"type": "string"}}
QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event_types": {"type": "array", "items": {"type": "string", "enum": list(EVENT_TYPES)}},
        "effective_at": {"type": "object", "properties": {name: _TIME for name in ("gt", "gte", "lt", "lte")}},
        "actor_ids": _IDS,
        "resource_ids": _IDS,
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
        "after": {"type": "string"},
        "before": {"type": "string"},
    },
}
_VALIDATOR = Draft202012Validator(QUERY_SCHEMA)
# effective_at is shown in whole seconds (truncated), so "shown > T" is "at or after T + 1" and
# "shown <= T" is "before T + 1": each bound becomes a lookup and the second it starts at.
_BOUNDS = {"gt": ("gte", 1), "gte": ("gte", 0), "lt": ("lt", 0), "lte": ("lt", 1)}


@dataclass(frozen=True)
class AuditQuery:
    """A validated query: the filters, the page size and at most one cursor (an entry's ``pk``)."""

    filters: dict[str, Any]
    limit: int
    after_pk: int | None
    before_pk: int | None


def parse_audit_query(params: QueryDict) -> AuditQuery:
    """Check ``params`` (see the module docstring); ``APIError`` 400 naming the parameter."""
    query = query_instance(params, QUERY_SCHEMA)
    validate_query(query, _VALIDATOR)
    if "after" in query and "before" in query:
        raise invalid_value_error("before", query["before"], why="Send either 'after' or 'before', not both.")
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
    return AuditQuery(
        filters=filters,
        limit=query.get("limit", DEFAULT_LIMIT),
        after_pk=_cursor_pk("after", query.get("after")),
        before_pk=_cursor_pk("before", query.get("before")),
    )


def _cursor_pk(param: str, public_id: str | None) -> int | None:
    if public_id is None:
        return None
    pk = AuditLogEntry.objects.filter(public_id=public_id).values_list("pk", flat=True).first()
    if pk is None:
        raise invalid_value_error(param, public_id, why="Use the 'id' of an audit log entry, e.g. a page's 'last_id'.")
    return pk


def filtered(queryset: QuerySet[AuditLogEntry], query: AuditQuery) -> QuerySet[AuditLogEntry]:
    """``queryset`` narrowed by the query's filters (not yet paged)."""
    return queryset.filter(**query.filters)
