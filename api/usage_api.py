"""The usage APIs' protocol: OpenAI's ``GET /v1/organization/usage/completions``, one implementation for two scopes.

- ``GET /v1/usage/completions`` (``api/usage_views.py``): the caller's key decides the scope: the
  figures are those of every key of the key's owner, never anyone else's.
- ``GET /v1/organization/usage/completions`` (the Administration API, ``organization.views``):
  every key of every user, with ``group_by=user_id`` (``user_id`` is ``user_{pk}``, see
  ``keys.ids``) and the ``user_ids`` filter besides the parameters below
  (:data:`ORGANIZATION_QUERY_SCHEMA`).

Query parameters (as in OpenAI's spec):

- ``start_time`` (required) and ``end_time`` (default: now): Unix seconds, ``[start, end)``.
- ``bucket_width``: ``1m``, ``1h`` or ``1d`` (default).  Buckets are aligned to UTC minutes,
  hours and days; the first and last are clipped to the range, and each bucket's
  ``start_time``/``end_time`` say what it covers.  Empty buckets are listed with no results.
- ``group_by``: ``model`` and/or ``api_key_id`` (others are a 400; the organization's also ``user_id``).  ``api_key_id`` is ``key_``
  plus the key's public prefix, e.g. ``key_AbCd1234``.
- ``models``, ``api_key_ids``: keep only these (the organization's also ``user_ids`` and
  ``project_ids``, which name users too: users stand for OpenAI's projects).
- Any other parameter is a 400: the spec's ``batch`` (and, key-scoped, ``user_ids`` and
  ``project_ids``) ``unsupported_parameter`` naming it, anything else "Unrecognized request argument
  supplied: NAME", as an unknown body field is.
- Our extension, to tell ``/v1/completions`` from ``/v1/chat/completions`` (OpenAI's endpoint is
  per API, ours covers both): ``group_by=endpoint`` adds an ``endpoint`` field (the request's
  path) to each result, and ``endpoints`` keeps only those paths.  Without them the answer is
  OpenAI's shape exactly.
- ``limit``: buckets per page (1d: default 7, max 31; 1h: 24, 168; 1m: 60, 1440), and ``page``:
  the ``next_page`` cursor of the previous answer.

Array parameters may be repeated (``group_by=model&group_by=api_key_id``), written with brackets
(``group_by[]=model``, as OpenAI's client sends them) or comma-separated.

A bad parameter is a 400 with OpenAI's ``code`` and words, from the same mapping as the request
bodies' (:func:`api.errors.schema_error`): the query is checked against :data:`QUERY_SCHEMA`
(the spec's parameters, narrowed to what this server does), e.g. ``limit=abc`` is ``invalid_type``
("Invalid type for 'limit': expected an integer, but got a string instead."), ``bucket_width=1w``
``invalid_value``, no ``start_time`` ``missing_required_parameter``.

``num_model_requests`` counts the requests that reached the model (see
``keys.usage.MODEL_REQUEST``), and the token sums are over the same requests.

Costs, OpenAI's ``GET /v1/organization/costs`` (and our key-scoped ``GET /v1/costs``): the same
range, pages and errors, daily buckets only (``bucket_width=1d``, ``limit`` up to 180, as OpenAI),
each result an ``organization.costs.result`` whose ``amount`` is the sum of the records' costs
(:mod:`keys.pricing`, the model prices in force when each request ran) in ``currency`` ``usd``.
``group_by`` takes ``line_item`` (the model, as OpenAI names a line item by model) and, for the
organization, ``project_id`` (the user: users are projects here); filters ``project_ids``
(organization only).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django.db.models import Count, Func, Sum
from django.db.models.functions import Coalesce, TruncDay, TruncHour, TruncMinute
from django.http import QueryDict
from jsonschema import Draft202012Validator

from api.errors import above_maximum_error, below_minimum_error, invalid_value_error
from api.query import query_instance, refuse_unknown, validate_query
from keys.db import db_call
from keys.ids import api_key_id, parse_api_key_id, parse_user_id, user_id
from keys.models import UsageRecord
from keys.periods import bucket_start
from keys.pricing import to_money
from keys.usage import MODEL_REQUEST

RESULT_OBJECT = "organization.usage.completions.result"
PAGE_PREFIX = "page_"


@dataclass(frozen=True)
class BucketWidth:
    name: str
    seconds: int
    trunc: type[Func]
    default_limit: int
    max_limit: int


BUCKET_WIDTHS = {
    width.name: width
    for width in (
        BucketWidth("1m", 60, TruncMinute, 60, 1440),
        BucketWidth("1h", 3600, TruncHour, 24, 168),
        BucketWidth("1d", 86400, TruncDay, 7, 31),
    )
}
# OpenAI's group_by names → the UsageRecord lookups that give their values.
GROUPS = {"model": "model", "api_key_id": "api_key__prefix", "endpoint": "endpoint", "user_id": "owner_id"}
KEY_GROUPS = ("model", "api_key_id", "endpoint")  # a user's own usage: user_id would say nothing
ORGANIZATION_GROUPS = (*KEY_GROUPS, "user_id")


@dataclass(frozen=True)
class UsageQuery:
    """A validated request: the range, the bucket width, grouping, filters and the page to answer."""

    start_time: int
    end_time: int
    width: BucketWidth
    group_by: tuple[str, ...]
    models: tuple[str, ...]
    endpoints: tuple[str, ...]
    api_key_prefixes: tuple[str, ...]
    limit: int
    page_start: int  # the aligned start of this page's first bucket
    user_pks: tuple[int, ...] | None = None  # the organization's ``user_ids``/``project_ids``; None: everyone


LAST_TIME = 253_370_764_800  # 9999-01-01T00:00:00Z, in Unix seconds
TIME = {"type": "integer", "minimum": 0, "maximum": LAST_TIME - 1}  # Python's datetimes end with the year 9999
# The spec's query parameters of ``GET /organization/usage/completions``, narrowed to what this
# server does: times from 1970 to 9998, two of the spec's six ``group_by`` values and our ``endpoint``, ``limit`` >= 1
# (its maximum depends on ``bucket_width``: a rule beyond the schema, in parse_usage_query).
QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "start_time": TIME,
        "end_time": TIME,
        "bucket_width": {"type": "string", "enum": list(BUCKET_WIDTHS)},
        "api_key_ids": {"type": "array", "items": {"type": "string"}},
        "models": {"type": "array", "items": {"type": "string"}},
        "endpoints": {"type": "array", "items": {"type": "string"}},
        "group_by": {"type": "array", "items": {"type": "string", "enum": list(KEY_GROUPS)}},
        "limit": {"type": "integer", "minimum": 1},
        "page": {"type": "string"},
    },
    "required": ["start_time"],
}
# The organization's: the same, plus the spec's ``user_ids`` filter and ``group_by=user_id``, and
# ``project_ids``: users stand for OpenAI's projects (``user_{pk}`` either way), so it filters users too.
ORGANIZATION_QUERY_SCHEMA = {
    **QUERY_SCHEMA,
    "properties": {
        **QUERY_SCHEMA["properties"],
        "user_ids": {"type": "array", "items": {"type": "string"}},
        "project_ids": {"type": "array", "items": {"type": "string"}},
        "group_by": {"type": "array", "items": {"type": "string", "enum": list(ORGANIZATION_GROUPS)}},
    },
}
# The spec's parameters that a scope does not take: a 400 ``unsupported_parameter`` naming each
# (any other unknown parameter is "Unrecognized request argument supplied").
_NO_BATCH = "there is no Batch API here, so every request is a non-batch one."
_OWN_USAGE = "this route reads the calling key's owner's usage only; an admin key reads everyone's at /v1/organization/usage/completions."
KEY_UNSUPPORTED = {"batch": _NO_BATCH, "user_ids": _OWN_USAGE, "project_ids": _OWN_USAGE}
ORGANIZATION_UNSUPPORTED = {"batch": _NO_BATCH}
_VALIDATORS = {False: Draft202012Validator(QUERY_SCHEMA), True: Draft202012Validator(ORGANIZATION_QUERY_SCHEMA)}

COSTS_RESULT_OBJECT = "organization.costs.result"
COSTS_CURRENCY = "usd"
# The costs' groups, as OpenAI names them, and the UsageRecord lookups that give their values.
COST_GROUPS = {"line_item": "model", "project_id": "owner_id"}
COSTS_WIDTH = BucketWidth("1d", 86400, TruncDay, 7, 180)
# The spec's query parameters of ``GET /organization/costs`` (daily buckets only).
COSTS_QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "start_time": TIME,
        "end_time": TIME,
        "bucket_width": {"type": "string", "enum": ["1d"]},
        "project_ids": {"type": "array", "items": {"type": "string"}},
        "group_by": {"type": "array", "items": {"type": "string", "enum": list(COST_GROUPS)}},
        "limit": {"type": "integer", "minimum": 1},
        "page": {"type": "string"},
    },
    "required": ["start_time"],
}
KEY_COSTS_QUERY_SCHEMA: dict[str, Any] = {
    **COSTS_QUERY_SCHEMA,
    "properties": {
        **{name: value for name, value in COSTS_QUERY_SCHEMA["properties"].items() if name != "project_ids"},
        "group_by": {"type": "array", "items": {"type": "string", "enum": ["line_item"]}},
    },
}
_COSTS_VALIDATORS = {
    False: Draft202012Validator(KEY_COSTS_QUERY_SCHEMA),
    True: Draft202012Validator(COSTS_QUERY_SCHEMA),
}


def parse_costs_query(params: QueryDict, now: int, *, organization: bool = False) -> UsageQuery:
    """Validate a costs query (:data:`COSTS_QUERY_SCHEMA`, key-scoped without ``project_ids`` and
    ``group_by=project_id``), with the same rules and errors as :func:`parse_usage_query`."""
    schema = COSTS_QUERY_SCHEMA if organization else KEY_COSTS_QUERY_SCHEMA
    refuse_unknown(params, schema, unsupported={} if organization else {"project_ids": _OWN_USAGE})
    query = query_instance(params, schema)
    validate_query(query, _COSTS_VALIDATORS[organization])
    return _usage_query(query, now, COSTS_WIDTH)


def parse_usage_query(params: QueryDict, now: int, *, organization: bool = False) -> UsageQuery:
    """Validate the query string against :data:`QUERY_SCHEMA` (``organization``:
    :data:`ORGANIZATION_QUERY_SCHEMA`), then the rules beyond it.

    Raises ``APIError`` 400 naming the ``param``, with OpenAI's code: what the schema refuses via
    :func:`api.errors.schema_error`; ``end_time`` not after ``start_time`` and ``limit`` over
    the width's maximum as ``integer_below_min_value``/``integer_above_max_value``; a ``page`` that
    is not this query's cursor as ``invalid_value``.
    """
    schema = ORGANIZATION_QUERY_SCHEMA if organization else QUERY_SCHEMA
    refuse_unknown(params, schema, unsupported=ORGANIZATION_UNSUPPORTED if organization else KEY_UNSUPPORTED)
    query = query_instance(params, schema)
    validate_query(query, _VALIDATORS[organization])
    return _usage_query(query, now, BUCKET_WIDTHS[query.get("bucket_width", "1d")])


def _usage_query(query: dict[str, Any], now: int, width: BucketWidth) -> UsageQuery:
    """The rules beyond the schema, for usage and costs alike."""
    start_time = query["start_time"]
    end_time = query.get("end_time", now)
    if end_time <= start_time:
        raise below_minimum_error(
            "end_time", start_time + 1, end_time, integer=True, why="end_time must be after start_time."
        )
    limit = query.get("limit", width.default_limit)
    if limit > width.max_limit:
        raise above_maximum_error(
            "limit",
            width.max_limit,
            limit,
            integer=True,
            why=f"With bucket_width {width.name} a page holds at most {width.max_limit} buckets.",
        )
    first = bucket_start(start_time, width.seconds)
    page_start = first if "page" not in query else _page_start(query["page"], first, end_time, width)
    return UsageQuery(
        start_time=start_time,
        end_time=end_time,
        width=width,
        group_by=tuple(dict.fromkeys(query.get("group_by", ()))),
        models=tuple(query.get("models", ())),
        endpoints=tuple(query.get("endpoints", ())),
        api_key_prefixes=tuple(parse_api_key_id(key_id) for key_id in query.get("api_key_ids", ())),
        limit=limit,
        page_start=page_start,
        user_pks=_filtered_user_pks(query),
    )


def _filtered_user_pks(query: dict[str, Any]) -> tuple[int, ...] | None:
    """The users that ``user_ids`` and ``project_ids`` (users are projects here) keep, both if both
    are given; ``None`` when neither is: everyone."""
    kept: tuple[int, ...] | None = None
    for name in ("user_ids", "project_ids"):
        if name in query:
            pks = _user_pks(query[name])
            kept = pks if kept is None else tuple(pk for pk in kept if pk in pks)
    return kept


def _user_pks(public_ids: list[str]) -> tuple[int, ...]:
    """The users the ids name; an id of no user's shape names nobody (and so filters out everything)."""
    return tuple(pk for pk in map(parse_user_id, public_ids) if pk is not None)


async def usage_page(query: UsageQuery, owner_id: int | None) -> dict[str, Any]:
    """:func:`build_usage_page`, from async code (the key-scoped view)."""
    return await db_call(build_usage_page, query, owner_id)


async def costs_page(query: UsageQuery, owner_id: int | None) -> dict[str, Any]:
    """:func:`build_costs_page`, from async code (the key-scoped view)."""
    return await db_call(build_costs_page, query, owner_id)


def build_costs_page(query: UsageQuery, owner_id: int | None = None) -> dict[str, Any]:
    """The costs page (OpenAI's ``CostsResponse``) for ``query`` over ``owner_id``'s records (everyone's when ``None``)."""
    return build_usage_page(query, owner_id, aggregate=_aggregate_costs)


def build_usage_page(query: UsageQuery, owner_id: int | None = None, *, aggregate: Any = None) -> dict[str, Any]:
    """The ``UsageResponse`` page for ``query`` over ``owner_id``'s usage records (everyone's when
    ``None``); ``aggregate`` fills the buckets (default: the completions usage's results)."""
    seconds = query.width.seconds
    boundaries: list[int] = []
    moment = query.page_start
    while moment < query.end_time and len(boundaries) < query.limit:
        boundaries.append(moment)
        moment += seconds
    low = max(query.start_time, boundaries[0])
    high = min(query.end_time, boundaries[-1] + seconds)
    grouped = (aggregate or _aggregate)(query, owner_id, low, high)
    data = [
        {
            "object": "bucket",
            "start_time": max(query.start_time, boundary),
            "end_time": min(query.end_time, boundary + seconds),
            "results": grouped.get(boundary, []),
        }
        for boundary in boundaries
    ]
    has_more = moment < query.end_time
    return {"object": "page", "data": data, "has_more": has_more, "next_page": _cursor(moment) if has_more else None}


def _records(query: UsageQuery, owner_id: int | None, low: int, high: int) -> Any:
    """The usage records in ``[low, high)`` that ``query`` and ``owner_id`` keep."""
    queryset = UsageRecord.objects.filter(
        MODEL_REQUEST,
        created_at__gte=datetime.fromtimestamp(low, timezone.utc),
        created_at__lt=datetime.fromtimestamp(high, timezone.utc),
    )
    if owner_id is not None:
        queryset = queryset.filter(owner_id=owner_id)
    if query.user_pks is not None:
        queryset = queryset.filter(owner_id__in=query.user_pks)
    if query.models:
        queryset = queryset.filter(model__in=query.models)
    if query.endpoints:
        queryset = queryset.filter(endpoint__in=query.endpoints)
    if query.api_key_prefixes:
        queryset = queryset.filter(api_key__prefix__in=query.api_key_prefixes)
    return queryset


def _aggregate_costs(query: UsageQuery, owner_id: int | None, low: int, high: int) -> dict[int, list[dict[str, Any]]]:
    """``{bucket start (Unix s): [costs result, ...]}`` for records in ``[low, high)``, grouped as asked."""
    lookups = [COST_GROUPS[name] for name in query.group_by]
    rows = (
        _records(query, owner_id, low, high)
        .annotate(bucket=query.width.trunc("created_at"))
        .values("bucket", *lookups)
        .annotate(nanos=Coalesce(Sum("cost_nanos"), 0))
        .order_by("bucket", *lookups)
    )
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        owner = row.get("owner_id")
        grouped.setdefault(int(row["bucket"].timestamp()), []).append(
            {
                "object": COSTS_RESULT_OBJECT,
                "amount": {"value": float(to_money(row["nanos"])), "currency": COSTS_CURRENCY},
                "line_item": row["model"] if "line_item" in query.group_by else None,
                "project_id": user_id(owner) if "project_id" in query.group_by and owner is not None else None,
            }
        )
    return grouped


def _aggregate(query: UsageQuery, owner_id: int | None, low: int, high: int) -> dict[int, list[dict[str, Any]]]:
    """``{bucket start (Unix s): [result, ...]}`` for records in ``[low, high)``, grouped as asked."""
    queryset = _records(query, owner_id, low, high)
    lookups = [GROUPS[name] for name in query.group_by]
    rows = (
        queryset.annotate(bucket=query.width.trunc("created_at"))
        .values("bucket", *lookups)
        .annotate(
            input_tokens=Coalesce(Sum("prompt_tokens"), 0),
            output_tokens=Coalesce(Sum("completion_tokens"), 0),
            num_model_requests=Count("id"),
        )
        .order_by("bucket", *lookups)
    )
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(int(row["bucket"].timestamp()), []).append(_result(row, query.group_by))
    return grouped


def _result(row: dict[str, Any], group_by: tuple[str, ...]) -> dict[str, Any]:
    """One ``UsageCompletionsResult``; the grouping fields not asked for are ``null``, as on OpenAI."""
    prefix = row.get("api_key__prefix")
    owner = row.get("owner_id")
    result = {
        "object": RESULT_OBJECT,
        "input_tokens": row["input_tokens"],
        "output_tokens": row["output_tokens"],
        "input_cached_tokens": 0,
        "input_audio_tokens": 0,
        "output_audio_tokens": 0,
        "num_model_requests": row["num_model_requests"],
        "project_id": None,
        "user_id": (user_id(owner) if owner is not None else None) if "user_id" in group_by else None,
        "api_key_id": (api_key_id(prefix) if prefix else None) if "api_key_id" in group_by else None,
        "model": row["model"] if "model" in group_by else None,
        "batch": None,
    }
    if "endpoint" in group_by:  # our extension; absent otherwise, so the shape stays OpenAI's
        result["endpoint"] = row["endpoint"]
    return result


def _cursor(bucket_start: int) -> str:
    return PAGE_PREFIX + base64.urlsafe_b64encode(str(bucket_start).encode()).decode()


def _page_start(cursor: str, first: int, end_time: int, width: BucketWidth) -> int:
    """The bucket start a ``next_page`` cursor names; 400 unless it is one of this range's buckets."""
    try:
        value = int(base64.urlsafe_b64decode(cursor.removeprefix(PAGE_PREFIX).encode()).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        value = None
    if value is None or not first <= value < end_time or (value - first) % width.seconds:
        raise invalid_value_error("page", cursor, why="Use the 'next_page' of a previous answer to the same query.")
    return value
