"""``GET /v1/organization/audit_logs``: OpenAI's ``list-audit-logs`` (``ListAuditLogsResponse``).

Newest first.  The answer is ``{"object": "list", "data": [AuditLog, ...], "first_id", "last_id",
"has_more"}``; ``after=<last_id>`` gives the next (older) page, ``before=<first_id>`` the previous
(newer) one, and ``has_more`` says whether more entries lie beyond this page in the direction
asked (older for a first page or ``after``, newer for ``before``).  Parameters: ``api.audit_api``.
Who may call it is set as for every Administration API view (``api.admin_api``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response

from audit.models import AuditLogEntry

from .admin_api import AdminAPIView
from .audit_api import AuditQuery, filtered, parse_audit_query


class AuditLogSerializer(serializers.BaseSerializer):
    """An entry as the spec's ``AuditLog`` (:meth:`audit.models.AuditLogEntry.to_dict`)."""

    def to_representation(self, instance: AuditLogEntry) -> dict[str, Any]:
        return instance.to_dict()


class OpenAIListPagination(BasePagination):
    """OpenAI's cursor lists over a queryset ordered newest first (by ``pk``): ``limit``,
    ``after``/``before`` by an entry's id, and the ``first_id``/``last_id``/``has_more`` envelope.

    The view parses the query (``view.audit_query``: an :class:`api.audit_api.AuditQuery`).
    """

    has_more = False

    def paginate_queryset(self, queryset: QuerySet, request: Request, view: Any = None) -> list[Any]:
        query: AuditQuery = view.audit_query
        if query.before_pk is not None:
            newer = list(queryset.filter(pk__gt=query.before_pk).order_by("pk")[: query.limit + 1])
            self.has_more = len(newer) > query.limit
            return list(reversed(newer[: query.limit]))
        if query.after_pk is not None:
            queryset = queryset.filter(pk__lt=query.after_pk)
        page = list(queryset.order_by("-pk")[: query.limit + 1])
        self.has_more = len(page) > query.limit
        return page[: query.limit]

    def get_paginated_response(self, data: Any) -> Response:
        return Response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": self.has_more,
            }
        )


class AuditLogListView(AdminAPIView, ListAPIView):
    """``GET /v1/organization/audit_logs``: the filtered, paged audit log (see the module docstring)."""

    serializer_class = AuditLogSerializer
    pagination_class = OpenAIListPagination
    queryset = AuditLogEntry.objects.all()

    def filter_queryset(self, queryset: QuerySet[AuditLogEntry]) -> QuerySet[AuditLogEntry]:
        self.audit_query = parse_audit_query(self.request.query_params)
        return filtered(queryset, self.audit_query)
