"""OpenAI's list pagination as a DRF pagination class.

A list answers ``{"object": "list", "data": [...], "first_id", "last_id", "has_more"}`` (the spec's
``ApiKeyList``, ``UserListResponse``, ``ProjectApiKeyListResponse``, ...).  Query parameters:
``limit`` (1 to 100, default 20) and ``after`` (the id of the last object of the previous page; the
page starts after it), and ``order`` (``asc``, the default: oldest first, or ``desc``); ``before``
is ``unsupported_parameter``.  The cursor
is the object's primary key, so a page never repeats or skips an object when others are added or
deleted meanwhile.  An ``after`` that names no object (never existed, or not in this list) is a 400
``invalid_value`` naming ``after``; an ``after`` whose object was deleted since still works.

The view says how its public ids map to primary keys: ``view.cursor_pk(after) -> int | None``.
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
        if "before" in query:
            raise APIError(
                "Unsupported parameter: 'before' is not supported by this server; page forward with 'after'.",
                param="before",
                code="unsupported_parameter",
            )
        limit = self._limit(query.get("limit"))
        descending = self._descending(query.get("order"))
        queryset = queryset.order_by("-pk" if descending else "pk")
        after = query.get("after")
        if after:
            pk = view.cursor_pk(after) if view is not None else None
            if pk is None:
                raise invalid_value_error("after", after, why="No object with this id is in this list.")
            queryset = queryset.filter(pk__lt=pk) if descending else queryset.filter(pk__gt=pk)
        rows = list(queryset[: limit + 1])
        self.has_more = len(rows) > limit
        return rows[:limit]

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
        """``after``, ``limit`` and ``order`` as drf-spectacular documents them."""
        return [
            {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "The id of the last object of the previous page."},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": self.max_limit, "default": self.default_limit}},
            {"name": "order", "in": "query", "required": False,
             "schema": {"type": "string", "enum": ["asc", "desc"], "default": "asc"}},
        ]  # fmt: skip

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
