"""Monthly token quotas: reserved before generation, settled to what was used, remembered across restarts.

A quota counts the prompt and completion tokens of the key's usage records in the calendar month
(UTC).  Requests here cost 5 prompt tokens plus ``max_tokens`` (4 unless said otherwise) on the
tiny model; ``quota_key`` may use 30 tokens a month.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from keys import limits
from keys.models import UsageRecord
from keys.usage import record_usage
from tests.inprocess_api import MODEL, body, post, post_many

pytestmark = pytest.mark.django_db(transaction=True)


def used_before(api_key, tokens: int, when=None) -> None:
    """A usage record of ``tokens`` prompt tokens for ``api_key``, as an earlier request left it."""
    fields = dict(
        request_id=f"cmpl-earlier-{tokens}-{when}",
        api_key=api_key,
        model=MODEL,
        status_code=200,
        latency_ms=1.0,
        prompt_tokens=tokens,
    )
    if when is not None:
        fields["created_at"] = when
    async_to_sync(record_usage)(**fields)


@pytest.fixture
def over_quota_key(quota_key):
    """``quota_key`` after earlier requests used 28 of its 30 tokens this month."""
    used_before(quota_key.api_key, 28)
    return quota_key


def test_a_key_over_its_quota_gets_insufficient_quota_and_is_told_not_to_retry(tiny_api, over_quota_key, limits_store):
    reply = post(over_quota_key.plaintext, body())

    assert reply.status == 429
    assert reply.error["type"] == "insufficient_quota" and reply.error["code"] == "insufficient_quota"
    assert reply.error["message"].startswith(
        "You exceeded your current quota: this API key may use 30 tokens per calendar month, 28 are used "
        "and this request needs up to 9"
    )
    assert reply.headers["x-should-retry"] == "false"
    assert "retry-after" not in reply.headers


def test_the_reservation_not_the_use_decides_so_a_request_that_might_overrun_is_refused(
    tiny_api, quota_key, limits_store
):
    fits = post(quota_key.plaintext, body(max_tokens=25))  # 5 + 25 = 30: exactly the quota
    over = post(quota_key.plaintext, body(max_tokens=1))

    assert fits.status == 200 and fits.body["usage"]["total_tokens"] == 30
    assert over.status == 429 and over.error["code"] == "insufficient_quota"


def test_the_quota_counts_the_tokens_really_used_not_those_reserved(tiny_api, quota_key, limits_store):
    stops_at_once = body(max_tokens=20, logit_bias={"0": 100})  # <eos> first: 5 prompt tokens, no completion

    first = post(quota_key.plaintext, stops_at_once)
    second = post(quota_key.plaintext, stops_at_once)  # 25 would not fit if the first kept its reservation

    assert first.body["usage"] == {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    assert second.status == 200


def test_concurrent_requests_cannot_overshoot_the_quota(tiny_api, quota_key, limits_store):
    replies = post_many(quota_key.plaintext, [body(max_tokens=5) for _ in range(6)])  # 10 tokens each

    assert sorted(r.status for r in replies) == [200, 200, 200, 429, 429, 429]
    assert sum(r.body["usage"]["total_tokens"] for r in replies if r.status == 200) == 30


def test_the_quota_remembers_this_months_usage_after_a_restart(
    tiny_api, quota_key, limits_store, settings, separate_limit_counters
):
    assert post(quota_key.plaintext, body(max_tokens=20)).status == 200  # 25 of 30 used

    # Every counter gone, as after a restart (or a Redis that lost its data).
    settings.API_LIMITS_REDIS_PREFIX = separate_limit_counters + "restarted:"

    assert post(quota_key.plaintext, body()).status == 429  # 9 more do not fit
    assert post(quota_key.plaintext, body(prompt="x")).status == 200  # 5 do


def test_last_months_usage_does_not_count_against_this_month(tiny_api, quota_key, limits_store):
    first_of_month = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    used_before(quota_key.api_key, 30, when=first_of_month - timedelta(seconds=1))

    assert post(quota_key.plaintext, body()).status == 200


def test_a_quota_of_zero_means_no_quota(tiny_api, user, limits_store, settings):
    from tests.conftest import issue

    settings.API_DEFAULT_MONTHLY_TOKENS = 10  # the default would refuse; the key's own 0 wins
    unlimited = issue(user, "unlimited", monthly_token_quota=0)
    used_before(unlimited.api_key, 1_000_000)

    assert post(unlimited.plaintext, body()).status == 200


def test_the_default_quota_applies_to_keys_without_their_own(tiny_api, valid_key, settings, limits_store):
    settings.API_DEFAULT_MONTHLY_TOKENS = 8

    reply = post(valid_key.plaintext, body())

    assert reply.status == 429 and "may use 8 tokens per calendar month" in reply.error["message"]


def test_a_refused_request_is_recorded_as_rate_limited_and_costs_nothing(tiny_api, over_quota_key, limits_store):
    reply = post(over_quota_key.plaintext, body())

    record = UsageRecord.objects.get(request_id=reply.request_id)
    assert (record.status_code, record.error_type, record.total_tokens) == (429, "insufficient_quota", 0)
    assert limits.month_tokens_in_database(over_quota_key.api_key.pk, limits.current_month()) == 28


def test_the_month_counter_follows_the_database_after_requests(tiny_api, quota_key, limits_store):
    post(quota_key.plaintext, body(max_tokens=3))
    post(quota_key.plaintext, body(max_tokens=17, logit_bias={"0": 100}))  # reserves 22, uses 5

    assert limits.month_tokens_in_database(quota_key.api_key.pk, limits.current_month()) == 8 + 5
    reply = post(quota_key.plaintext, body(max_tokens=13))  # 13 + 5 = 18 > 30 - 13
    assert reply.status == 429 and ", 13 are used and this request needs up to 18" in reply.error["message"]
