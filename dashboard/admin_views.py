"""Staff pages inside the admin: the usage dashboard, its CSV export and the list of accounts.

Each is wrapped in ``admin.site.admin_view`` by ``dashboard/urls.py``: staff only (anyone else is
sent to the admin's login), never cached, CSRF-protected, with the admin's look and breadcrumbs.
"""

from __future__ import annotations

import csv
import math
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import render

from inference import process
from keys import periods, stats
from keys.models import APIKey, DailyUsage
from keys.usage import month_tokens

from .forms import UsageFilterForm

HOURS_SHOWN = 24
CSV_COLUMNS = (
    ("created_at", "created_at"),
    ("request_id", "request_id"),
    ("username", "owner__username"),
    ("api_key_prefix", "api_key__prefix"),
    ("api_key_name", "api_key__name"),
    ("model", "model"),
    ("endpoint", "endpoint"),
    ("stream", "stream"),
    ("status_code", "status_code"),
    ("finish_reason", "finish_reason"),
    ("error_type", "error_type"),
    ("prompt_tokens", "prompt_tokens"),
    ("completion_tokens", "completion_tokens"),
    ("total_tokens", "total_tokens"),
    ("latency_ms", "latency_ms"),
    ("time_to_first_token_ms", "time_to_first_token_ms"),
    ("user", "user"),
)
# A cell starting with one of these is a formula to a spreadsheet; text from clients (the
# request's ``user`` field, key names) is quoted so that opening the export cannot run it.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def dashboard(request: HttpRequest) -> HttpResponse:
    """``/admin/dashboard/``: usage over time, rates, top keys and users, models, latencies, live engine."""
    form = UsageFilterForm(request.GET or None)
    window = form.window()
    records = form.records(window)
    # Per hour over the last day of the window, per day over the whole window (30 days by default).
    last_hour = periods.floor_hour(window.end - timedelta(microseconds=1))
    hours = stats.Window(last_hour - timedelta(hours=HOURS_SHOWN - 1), last_hour + periods.HOUR)
    hourly = stats.time_series(form.records(hours), "hour", hours.start, HOURS_SHOWN)
    daily = stats.time_series(records, "day", window.start, math.ceil((window.end - window.start) / periods.DAY))
    context = {
        **admin.site.each_context(request),
        "title": "Usage dashboard",
        "form": form,
        "window": window,
        "summary": stats.summary(records),
        "latency": stats.percentiles(records, "latency_ms"),
        "ttft": stats.percentiles(records, "time_to_first_token_ms"),
        "top_keys": stats.top_keys(records),
        "top_users": stats.top_users(records),
        "models": stats.per_model(records),
        "model_names": model_names(),
        "endpoints": stats.per_endpoint(records),
        "hourly": stats.chart_data(hourly, "hour"),
        "daily": stats.chart_data(daily, "day"),
        "query": request.GET.urlencode(),
        "percentile_sample": stats.PERCENTILE_SAMPLE,
    }
    return render(request, "dashboard/dashboard.html", context)


def model_names() -> list[str]:
    """The model filter's suggestions: the models this process serves, in their order, then any other
    model that usage was recorded under (one served elsewhere, or no more)."""
    served = [served.id for served in process.current() or ()]
    # The daily rollup, a row per key, model and day, is far smaller than the records it sums.
    recorded = DailyUsage.objects.exclude(model="").values_list("model", flat=True).distinct().order_by("model")
    return [*served, *(name for name in recorded if name not in served)]


def export_csv(request: HttpRequest) -> HttpResponse:
    """``/admin/dashboard/export.csv``: the usage records the dashboard's filters select, as CSV."""
    form = UsageFilterForm(request.GET or None)
    if form.is_bound and not form.is_valid():
        return HttpResponseBadRequest("Invalid filters: " + "; ".join(m for ms in form.errors.values() for m in ms))
    window = form.window()
    # values(), not values_list(): in Django 5.2 only the former streams through aiterator().
    rows = form.records(window).order_by("created_at", "id").values(*(lookup for _, lookup in CSV_COLUMNS))
    response = StreamingHttpResponse(_csv_lines(rows), content_type="text/csv; charset=utf-8")
    name = f"usage-{window.start:%Y-%m-%d}-{(window.end - timedelta(microseconds=1)):%Y-%m-%d}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


class _Line:
    """A file-like object whose ``write`` returns the line, so ``csv.writer`` can feed a stream."""

    def write(self, value: str) -> str:
        return value


async def _csv_lines(rows) -> AsyncIterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow([name for name, _ in CSV_COLUMNS])
    async for row in rows.aiterator(chunk_size=2000):
        yield writer.writerow([_cell(row[lookup]) for _, lookup in CSV_COLUMNS])


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def accounts(request: HttpRequest) -> HttpResponse:
    """``/admin/dashboard/accounts/``: every user with their keys and month-to-date tokens."""
    query = request.GET.get("q", "").strip()
    users = get_user_model()._default_manager.order_by("username")
    if query:
        users = users.filter(Q(username__icontains=query) | Q(email__icontains=query))
    page = Paginator(users, 50).get_page(request.GET.get("page"))
    owners = [user.pk for user in page]
    active_keys = dict(
        APIKey.objects.active().filter(owner__in=owners).values_list("owner_id").annotate(Count("id")).order_by()
    )
    month = month_tokens(periods.month_name(), owner_ids=owners)
    rows = [
        {"user": user, "active_keys": active_keys.get(user.pk, 0), "month_tokens": month.get(user.pk, 0)}
        for user in page
    ]
    context = {**admin.site.each_context(request), "title": "Accounts", "page": page, "rows": rows, "q": query}
    return render(request, "dashboard/accounts.html", context)
