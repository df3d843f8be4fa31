"""Usage figures from :class:`keys.models.UsageRecord`, for the staff dashboard and the account pages.

(Periods come from :mod:`keys.periods`; what an error is from :data:`keys.models.ERROR_STATUS`.)

Counting and summing happen in the database through the ORM (``TruncHour``/``TruncDay``,
``Count``, ``Sum`` with ``filter=``), which SQLite and PostgreSQL both support.  Percentiles are
computed in Python over a bounded query: the newest ``PERCENTILE_SAMPLE`` rows of the window.
Times are UTC (``TIME_ZONE``), so an hour or a day bucket means the same on every database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncDay, TruncHour
from django.utils import timezone

from keys.models import ERROR_STATUS, RATE_LIMITED_STATUS, UsageRecord
from keys.periods import DAY, HOUR, month_start

# Percentiles read at most this many rows (the newest of the window): enough for a stable p95
# without loading a busy month into memory.
PERCENTILE_SAMPLE = 20_000

_TRUNC = {"hour": TruncHour, "day": TruncDay}
_STEP = {"hour": HOUR, "day": DAY}


@dataclass(frozen=True)
class Window:
    """A half-open time range ``[start, end)``."""

    start: datetime
    end: datetime


def records(
    window: Window,
    *,
    owner_id: int | None = None,
    api_key_id: int | None = None,
    model: str | None = None,
    endpoint: str | None = None,
) -> QuerySet[UsageRecord]:
    """Usage records created in ``window``, narrowed to an owner, a key, a model and an endpoint
    (``/v1/completions``, ``/v1/chat/completions``) when given."""
    queryset = UsageRecord.objects.filter(created_at__gte=window.start, created_at__lt=window.end)
    if owner_id is not None:
        queryset = queryset.filter(owner_id=owner_id)
    if api_key_id is not None:
        queryset = queryset.filter(api_key_id=api_key_id)
    if model:
        queryset = queryset.filter(model=model)
    if endpoint:
        queryset = queryset.filter(endpoint=endpoint)
    return queryset


def _totals() -> dict[str, Any]:
    """The aggregate expressions every table shares: requests, tokens in and out, cost, errors."""
    return {
        "requests": Count("id"),
        "input_tokens": Coalesce(Sum("prompt_tokens"), 0),
        "output_tokens": Coalesce(Sum("completion_tokens"), 0),
        "tokens": Coalesce(Sum("total_tokens"), 0),
        "cost_nanos": Coalesce(Sum("cost_nanos"), 0),
        "errors": Count("id", filter=ERROR_STATUS),
        "rate_limited": Count("id", filter=RATE_LIMITED_STATUS),
    }


def summary(queryset: QuerySet[UsageRecord]) -> dict[str, Any]:
    """Totals and error rates: requests, tokens, errors (429s apart), 4xx (429s included), 5xx and
    429 counts, and their shares (0..1)."""
    totals = queryset.order_by().aggregate(
        **_totals(),
        client_errors=Count("id", filter=Q(status_code__gte=400, status_code__lt=500)),
        server_errors=Count("id", filter=Q(status_code__gte=500)),
    )
    requests = totals["requests"]
    for name in ("rate_limited", "client_errors", "server_errors", "errors"):
        totals[f"{name}_rate"] = totals[name] / requests if requests else 0.0
    return totals


def time_series(queryset: QuerySet[UsageRecord], unit: str, start: datetime, count: int) -> list[dict[str, Any]]:
    """``count`` consecutive buckets of ``unit`` (``"hour"`` or ``"day"``) from ``start``, empty ones included.

    Each bucket: ``start`` (aware UTC datetime), ``requests``, ``input_tokens``, ``output_tokens``,
    ``tokens``, ``errors`` (status >= 400 but 429, ``keys.models.ERROR_STATUS``) and ``rate_limited`` (429).
    """
    step = _STEP[unit]
    end = start + step * count
    rows = (
        queryset.filter(created_at__gte=start, created_at__lt=end)
        .annotate(bucket=_TRUNC[unit]("created_at"))
        .values("bucket")
        .annotate(**_totals())
        .order_by()
    )
    found = {row["bucket"]: row for row in rows}
    empty = {name: 0 for name in _totals()}
    buckets = []
    for index in range(count):
        moment = start + step * index
        row = found.get(moment, empty)
        buckets.append({"start": moment, **{name: row[name] for name in empty}})
    return buckets


def chart_data(buckets: list[dict[str, Any]], unit: str) -> dict[str, list]:
    """Bucket lists as Chart.js wants them: one label list and one list per figure."""
    label = "%H:00" if unit == "hour" else "%b %d"
    data: dict[str, list] = {"labels": [bucket["start"].strftime(label) for bucket in buckets]}
    for name in ("requests", "input_tokens", "output_tokens", "tokens", "errors"):
        data[name] = [bucket[name] for bucket in buckets]
    return data


def percentiles(
    queryset: QuerySet[UsageRecord], field: str, points: tuple[int, ...] = (50, 95)
) -> dict[int, float | None]:
    """``{p: value}`` of ``field`` over the window's successful requests (``None`` without data).

    Linear interpolation between closest ranks (numpy's default) over at most the newest
    ``PERCENTILE_SAMPLE`` rows.
    """
    values = sorted(
        queryset.filter(status_code=200, **{f"{field}__isnull": False})
        .order_by("-created_at")
        .values_list(field, flat=True)[:PERCENTILE_SAMPLE]
    )
    return {point: percentile(values, point) for point in points}


def percentile(ordered: list[float], point: float) -> float | None:
    """The ``point``-th percentile (0..100) of the sorted list ``ordered``; ``None`` if it is empty."""
    if not ordered:
        return None
    rank = (len(ordered) - 1) * point / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def top_keys(queryset: QuerySet[UsageRecord], limit: int = 10) -> list[dict[str, Any]]:
    """The keys that used the most tokens: id, name, prefix, owner's username and totals.

    Records of a deleted key (``api_key`` is ``NULL``) form one row with ``api_key_id`` ``None``.
    """
    rows = (
        queryset.values("api_key_id")
        .annotate(name=F("api_key__name"), prefix=F("api_key__prefix"), username=F("api_key__owner__username"))
        .annotate(**_totals())
        .order_by("-tokens", "-requests")[:limit]
    )
    return list(rows)


def top_users(queryset: QuerySet[UsageRecord], limit: int = 10) -> list[dict[str, Any]]:
    """The users whose keys used the most tokens: id, username and totals."""
    rows = (
        queryset.values("owner_id")
        .annotate(username=F("owner__username"))
        .annotate(**_totals())
        .order_by("-tokens", "-requests")[:limit]
    )
    return list(rows)


def per_model(queryset: QuerySet[UsageRecord]) -> list[dict[str, Any]]:
    """Totals for each model, most tokens first."""
    return list(queryset.values("model").annotate(**_totals()).order_by("-tokens", "model"))


def per_endpoint(queryset: QuerySet[UsageRecord]) -> list[dict[str, Any]]:
    """Totals for each endpoint (``/v1/completions``, ``/v1/chat/completions``), most tokens first."""
    return list(queryset.values("endpoint").annotate(**_totals()).order_by("-tokens", "endpoint"))


def month_to_date_by_key(owner_id: int, now: datetime | None = None) -> dict[int, dict[str, int]]:
    """``{api_key_id: totals}`` for ``owner_id``'s keys since the first of this month (UTC)."""
    now = now or timezone.now()
    rows = (
        records(Window(month_start(now), now + timedelta(seconds=1)), owner_id=owner_id)
        .filter(api_key_id__isnull=False)
        .values("api_key_id")
        .annotate(**_totals())
        .order_by()
    )
    return {row["api_key_id"]: row for row in rows}
