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
- ``project_ids[]``: users stand for OpenAI's projects, so ``user_…``: the entries about those users
  or any of their API keys (a project's events, as OpenAI's are about the project or its keys).

Any other parameter is a 400: the spec's ``actor_emails[]`` and ``tenant_only``
``unsupported_parameter`` naming it, anything else "Unrecognized request argument supplied: NAME".

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

from api.query import query_instance, refuse_unknown, validate_query
from audit.models import EVENT_TYPES, AuditLogEntry
from keys import ids
from keys.models import APIKey

_TIME = {"type": "integer", "minimum": 0, "maximum": 253_370_764_799}
_IDS = {"type": "array", "items": {"type": "string"}}
QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event_types": {"type": "array", "items": {"type": "string", "enum": list(EVENT_TYPES)}},
        "effective_at": {"type": "object", "properties": {name: _TIME for name in ("gt", "gte", "lt", "lte")}},
        "actor_ids": _IDS,
        "resource_ids": _IDS,
        "project_ids": _IDS,
    },
}
PAGING = ("limit", "after", "before")  # read by the pagination class
UNSUPPORTED = {
    "actor_emails": "filter by actor_ids (user_… or an admin key's key_…) instead.",
    "tenant_only": "this server has no tenant-scoped events.",
}
_VALIDATOR = Draft202012Validator(QUERY_SCHEMA)
# effective_at is shown in whole seconds (truncated), so "shown > T" is "at or after T + 1" and
# "shown <= T" is "before T + 1": each bound becomes a lookup and the second it starts at.
_BOUNDS = {"gt": ("gte", 1), "gte": ("gte", 0), "lt": ("lt", 0), "lte": ("lt", 1)}


def audit_filters(params: QueryDict) -> dict[str, Any]:
    """The queryset filters ``params`` ask for (see the module docstring); ``APIError`` 400 naming
    the parameter."""
    refuse_unknown(params, QUERY_SCHEMA, also=PAGING, unsupported=UNSUPPORTED)
    query = query_instance(params, QUERY_SCHEMA)
    validate_query(query, _VALIDATOR)
    filters: dict[str, Any] = {}
    if "event_types" in query:
        filters["type__in"] = query["event_types"]
    if "actor_ids" in query:
        filters["actor_id__in"] = query["actor_ids"]
    if "resource_ids" in query:
        filters["resource_id__in"] = query["resource_ids"]
    if "project_ids" in query:
        filters["resource_id__in"] = _project_resources(query["project_ids"], filters.get("resource_id__in"))
    for bound, seconds in query.get("effective_at", {}).items():
        lookup, shift = _BOUNDS[bound]
        moment = datetime.fromtimestamp(seconds + shift, timezone.utc)
        key = f"effective_at__{lookup}"
        if key in filters:  # gt with gte, or lt with lte: the narrower bound holds
            moment = max(filters[key], moment) if lookup == "gte" else min(filters[key], moment)
        filters[key] = moment
    return filters


def _project_resources(project_ids: list[str], resource_ids: list[str] | None) -> list[str]:
    """The resource ids of the users ``project_ids`` name and of their API keys (revoked ones too:
    their entries stay), within ``resource_ids`` when that filter is given too."""
    pks = [pk for pk in map(ids.parse_user_id, project_ids) if pk is not None]
    prefixes = APIKey.objects.filter(owner_id__in=pks).values_list("prefix", flat=True)
    resources = [ids.user_id(pk) for pk in pks] + [ids.api_key_id(prefix) for prefix in prefixes]
    return resources if resource_ids is None else [rid for rid in resources if rid in resource_ids]


def filtered(queryset: QuerySet[AuditLogEntry], params: QueryDict) -> QuerySet[AuditLogEntry]:
    """``queryset`` narrowed by the filters in ``params`` (not yet paged)."""
    return queryset.filter(**audit_filters(params))
