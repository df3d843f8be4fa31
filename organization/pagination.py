"""OpenAI's list pagination as a DRF pagination class, the one every Administration API list uses.

A list answers ``{"object": "list", "data": [...], "first_id", "last_id", "has_more"}`` (the spec's
``ApiKeyList``, ``UserListResponse``, ``ProjectApiKeyListResponse``, ``ListAuditLogsResponse``, ...).
Query parameters: ``limit`` (1 to 100, default 20), ``after`` (the id of the last object of the
previous page; the page starts after it) and, where the view allows:

- ``order`` (``asc``, the default: oldest first, or ``desc``); a view with
  ``list_newest_first = True`` (the audit log) is always newest first and takes no ``order``.
- ``before`` (the id of the first object of the next page; the page ends just before it, and
  ``has_more`` says whether more lie beyond it in that direction), where the view sets
  ``list_pages_back = True`` (the audit log, as OpenAI's); elsewhere ``before`` is
  ``unsupported_parameter``, and ``after`` with ``before`` is a 400 naming ``before``.

The cursor is the object's primary key, so a page never repeats or skips an object when others are
added or deleted meanwhile.  A cursor that names no object (never existed, or not in this list) is
a 400 ``invalid_value`` naming it; one whose object was deleted since still works.

The view says how its public ids map to primary keys: ``view.cursor_pk(public_id) -> int | None``.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework.pagination import BasePagination
from rest_framework.response import Response

from api.errors import APIError, above_maximum_error, below_minimum_error, invalid_type_error, invalid_value_error

_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")


class OpenAIListPagination(BasePagination):
    """Cursor pagination on the primary key, in OpenAI's list shape (see the module docstring)."""

    default_limit = 20
    max_limit = 100

    def paginate_queryset(self, queryset, request, view=None) -> list[Any]:
        """The page's objects; ``has_more`` from fetching one more than ``limit``."""
        query = request.query_params
        pages_back = getattr(view, "list_pages_back", False)
        if "before" in query and not pages_back:
            raise APIError(
                "Unsupported parameter: 'before' is not supported by this server; page forward with 'after'.",
                param="before",
                code="unsupported_parameter",
            )
        limit = self._limit(query.get("limit"))
        descending = True if getattr(view, "list_newest_first", False) else self._descending(query.get("order"))
        after, before = query.get("after"), query.get("before") if pages_back else None
        if after and before:
            raise invalid_value_error("before", before, why="Send either 'after' or 'before', not both.")
        if before:
            # Walk the other way from the cursor, then turn the page round.
            pk = self._cursor_pk(view, "before", before)
            queryset = queryset.filter(pk__gt=pk) if descending else queryset.filter(pk__lt=pk)
            rows = list(queryset.order_by("pk" if descending else "-pk")[: limit + 1])
            self.has_more = len(rows) > limit
            return list(reversed(rows[:limit]))
        queryset = queryset.order_by("-pk" if descending else "pk")
        if after:
            pk = self._cursor_pk(view, "after", after)
            queryset = queryset.filter(pk__lt=pk) if descending else queryset.filter(pk__gt=pk)
        rows = list(queryset[: limit + 1])
        self.has_more = len(rows) > limit
        return rows[:limit]

    @staticmethod
    def _cursor_pk(view: Any, param: str, public_id: str) -> int:
        pk = view.cursor_pk(public_id) if view is not None else None
        if pk is None:
            raise invalid_value_error(param, public_id, why="No object with this id is in this list.")
        return pk

    def get_paginated_response(self, data: list[dict[str, Any]]) -> Response:
        return Response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": self.has_more,
            }
        )

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The list's OpenAPI schema around ``schema`` (the items' array), for drf-spectacular."""
        return {
            "type": "object",
            "required": ["object", "data", "has_more"],
            "properties": {
                "object": {"type": "string", "enum": ["list"]},
                "data": schema,
                "first_id": {"type": "string", "nullable": True},
                "last_id": {"type": "string", "nullable": True},
                "has_more": {"type": "boolean"},
            },
        }

    def get_schema_operation_parameters(self, view) -> list[dict[str, Any]]:
        """``after``, ``limit``, and ``order`` or ``before`` where the view takes them, for drf-spectacular."""
        parameters = [
            {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "The id of the last object of the previous page."},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": self.max_limit, "default": self.default_limit}},
        ]  # fmt: skip
        if getattr(view, "list_pages_back", False):
            parameters.append(
                {"name": "before", "in": "query", "required": False, "schema": {"type": "string"},
                 "description": "The id of the first object of the next page: the page before it."}
            )  # fmt: skip
        if not getattr(view, "list_newest_first", False):
            parameters.append(
                {"name": "order", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": ["asc", "desc"], "default": "asc"}}
            )  # fmt: skip
        return parameters

    def _limit(self, text: str | None) -> int:
        if text is None:
            return self.default_limit
        if not _INTEGER.fullmatch(text.strip()):
            raise invalid_type_error("limit", ["an integer"], text)
        limit = int(text)
        if limit < 1:
            raise below_minimum_error("limit", 1, limit, integer=True)
        if limit > self.max_limit:
            raise above_maximum_error("limit", self.max_limit, limit, integer=True)
        return limit

    @staticmethod
    def _descending(text: str | None) -> bool:
        if text is None or text == "asc":
            return False
        if text == "desc":
            return True
        raise invalid_value_error("order", text, supported=["asc", "desc"])
