"""The dashboard's figures (``keys.stats``): buckets, rates, rankings and percentiles."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from keys import stats
from tests.conftest import issue
from tests.usage_helpers import add_usage

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 3, 10, 12, 0, tzinfo=timezone.utc)
WINDOW = stats.Window(NOON - timedelta(days=30), NOON + timedelta(days=1))


def test_hourly_buckets_count_requests_tokens_and_errors_and_keep_empty_hours(valid_key):
    add_usage(valid_key.api_key, NOON + timedelta(minutes=5), prompt_tokens=3, completion_tokens=4)
    add_usage(valid_key.api_key, NOON + timedelta(minutes=50), status_code=429, prompt_tokens=0, completion_tokens=0)
    add_usage(valid_key.api_key, NOON + timedelta(hours=2), prompt_tokens=1, completion_tokens=1)

    buckets = stats.time_series(stats.records(WINDOW), "hour", NOON, 4)

    assert [bucket["start"] for bucket in buckets] == [NOON + timedelta(hours=h) for h in range(4)]
    assert [bucket["requests"] for bucket in buckets] == [2, 0, 1, 0]
    assert [bucket["tokens"] for bucket in buckets] == [7, 0, 2, 0]
    assert (buckets[0]["input_tokens"], buckets[0]["output_tokens"]) == (3, 4)
    assert (buckets[0]["errors"], buckets[0]["rate_limited"]) == (0, 1)  # a 429 is rate limited, not an error


def test_the_dashboard_counts_errors_as_the_daily_rollup_does(valid_key):
    from keys.models import rollup_increments

    records = [add_usage(valid_key.api_key, NOON, status_code=status) for status in (200, 400, 429, 499, 500)]

    summary = stats.summary(stats.records(WINDOW))

    assert summary["errors"] == sum(rollup_increments(record)["errors"] for record in records) == 3
    assert summary["rate_limited"] == sum(rollup_increments(record)["rate_limited"] for record in records) == 1


def test_daily_buckets_split_at_midnight_utc(valid_key):
    midnight = NOON.replace(hour=0)
    add_usage(valid_key.api_key, midnight - timedelta(seconds=1))
    add_usage(valid_key.api_key, midnight)

    buckets = stats.time_series(stats.records(WINDOW), "day", midnight - timedelta(days=1), 2)

    assert [bucket["requests"] for bucket in buckets] == [1, 1]


def test_the_summary_gives_429_4xx_and_5xx_rates(valid_key):
    for status in (200, 200, 200, 200, 200, 429, 400, 500):
        add_usage(valid_key.api_key, NOON, status_code=status)

    summary = stats.summary(stats.records(WINDOW))

    assert summary["requests"] == 8
    assert summary["rate_limited_rate"] == pytest.approx(1 / 8)
    assert summary["client_errors_rate"] == pytest.approx(2 / 8)  # the 429 is a 4xx too
    assert summary["server_errors_rate"] == pytest.approx(1 / 8)


def test_an_empty_window_has_zero_rates_and_no_percentiles():
    assert stats.summary(stats.records(WINDOW))["errors_rate"] == 0.0
    assert stats.percentiles(stats.records(WINDOW), "latency_ms") == {50: None, 95: None}


def test_percentiles_interpolate_over_successful_requests_only(valid_key):
    for latency in range(1, 101):  # 1..100 ms
        add_usage(valid_key.api_key, NOON, latency_ms=float(latency))
    add_usage(valid_key.api_key, NOON, latency_ms=99999.0, status_code=500)

    found = stats.percentiles(stats.records(WINDOW), "latency_ms")

    assert found[50] == pytest.approx(50.5)
    assert found[95] == pytest.approx(95.05)


def test_top_keys_and_users_are_ranked_by_tokens(valid_key, other_users_key):
    add_usage(valid_key.api_key, NOON, prompt_tokens=10, completion_tokens=0)
    add_usage(other_users_key.api_key, NOON, prompt_tokens=500, completion_tokens=500)

    keys = stats.top_keys(stats.records(WINDOW))
    users = stats.top_users(stats.records(WINDOW))

    assert [(row["prefix"], row["tokens"]) for row in keys] == [
        (other_users_key.api_key.prefix, 1000),
        (valid_key.api_key.prefix, 10),
    ]
    assert [(row["username"], row["requests"]) for row in users] == [("bob", 1), ("alice", 1)]


def test_per_model_totals(valid_key):
    add_usage(valid_key.api_key, NOON, model="a", prompt_tokens=1, completion_tokens=2)
    add_usage(valid_key.api_key, NOON, model="a", prompt_tokens=1, completion_tokens=2)
    add_usage(valid_key.api_key, NOON, model="b", prompt_tokens=1, completion_tokens=0)

    rows = {row["model"]: row for row in stats.per_model(stats.records(WINDOW))}

    assert (rows["a"]["requests"], rows["a"]["input_tokens"], rows["a"]["output_tokens"]) == (2, 2, 4)
    assert rows["b"]["tokens"] == 1


def test_filters_narrow_to_one_owner_key_and_model(valid_key, other_users_key, user):
    second = issue(user, "alice second")
    add_usage(valid_key.api_key, NOON, model="a")
    add_usage(second.api_key, NOON, model="b")
    add_usage(other_users_key.api_key, NOON, model="a")

    assert stats.records(WINDOW, owner_id=user.pk).count() == 2
    assert stats.records(WINDOW, api_key_id=second.api_key.pk).count() == 1
    assert stats.records(WINDOW, owner_id=user.pk, model="a").count() == 1


def test_month_to_date_counts_each_key_since_the_first_of_the_month(valid_key):
    now = datetime(2026, 3, 15, 9, 0, tzinfo=timezone.utc)
    add_usage(valid_key.api_key, datetime(2026, 2, 28, 23, 59, tzinfo=timezone.utc))
    add_usage(valid_key.api_key, datetime(2026, 3, 1, 0, 0, tzinfo=timezone.utc), prompt_tokens=2, completion_tokens=3)

    month = stats.month_to_date_by_key(valid_key.api_key.owner_id, now)

    assert month[valid_key.api_key.pk]["tokens"] == 5
    assert month[valid_key.api_key.pk]["requests"] == 1


def test_percentile_of_one_value_is_that_value():
    assert stats.percentile([7.0], 95) == 7.0


def test_thousands_keeps_large_integers_exact():
    from dashboard.templatetags.dashboard_format import thousands

    assert thousands(9_223_372_036_854_775_807) == "9,223,372,036,854,775,807"
    assert (thousands(None), thousands(1234.6)) == ("0", "1,235")
