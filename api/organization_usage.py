"""``GET /v1/organization/usage/completions``: everyone's usage, for the Administration API.

The same buckets, pages and parameter errors as the key-scoped ``GET /v1/usage/completions``
(one implementation, ``api/usage_api.py``), over every key of every user, with ``group_by``
``user_id`` and the ``user_ids`` filter besides ``model``, ``api_key_id``, ``models`` and
``api_key_ids``.  Who may call it is set as for every Administration API view (``api.admin_api``).
"""

from __future__ import annotations

import math
import time

from rest_framework.request import Request
from rest_framework.response import Response

from .admin_api import AdminAPIView
from .usage_api import build_usage_page, parse_usage_query


class OrganizationUsageCompletionsView(AdminAPIView):
    """OpenAI's ``UsageResponse`` (``object: "page"``, buckets of ``UsageCompletionsResult``) for
    the whole organization; a bad parameter is a 400 naming it (``api.usage_api.parse_usage_query``)."""

    def get(self, request: Request) -> Response:
        # Rounded up: without an end_time, a request made this very second is included.
        query = parse_usage_query(request.query_params, now=math.ceil(time.time()), organization=True)
        return Response(build_usage_page(query))
