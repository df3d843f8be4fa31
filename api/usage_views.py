"""``GET /v1/usage/completions`` and ``GET /v1/costs``: thin, like the other API views: authenticate, parse, answer."""

from __future__ import annotations

import math
import time

from django.http import HttpRequest, HttpResponse, JsonResponse

from keys.auth import touch_last_used

from .auth import authenticate
from .errors import APIError, error_response
from .usage_api import costs_page, parse_costs_query, parse_usage_query, usage_page
from .views import api_view


@api_view("GET")
async def usage_completions(request: HttpRequest) -> HttpResponse:
    """OpenAI's ``UsageResponse`` for the calling key's owner (see ``api/usage_api.py``)."""
    try:
        api_key = await authenticate(request)
        # Rounded up: without an end_time, a request made this very second is included.
        query = parse_usage_query(request.GET, now=math.ceil(time.time()))
    except APIError as error:
        return error_response(error)
    await touch_last_used(api_key)
    return JsonResponse(await usage_page(query, api_key.owner_id))


@api_view("GET")
async def costs(request: HttpRequest) -> HttpResponse:
    """OpenAI's costs page for the calling key's owner (see ``api/usage_api.py``)."""
    try:
        api_key = await authenticate(request)
        query = parse_costs_query(request.GET, now=math.ceil(time.time()))
    except APIError as error:
        return error_response(error)
    await touch_last_used(api_key)
    return JsonResponse(await costs_page(query, api_key.owner_id))
