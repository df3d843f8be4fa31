"""The limiter's metrics: each 429 counted under the limit that refused, Redis's failures and fail-open periods."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from prometheus_client import REGISTRY

from api.auth import admit
from api.translate import LimitExceeded
from tests.conftest import issue

pytestmark = pytest.mark.django_db(transaction=True)


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def refused(api_key, tokens: int, admitted: int) -> None:
    """Admit ``admitted`` requests of ``tokens`` (left in flight), then expect the next one's 429."""

    async def scenario():
        for i in range(admitted):
            await admit(api_key, f"cmpl-{i}", tokens)
        with pytest.raises(LimitExceeded):
            await admit(api_key, "cmpl-refused", tokens)

    async_to_sync(scenario)()


@pytest.mark.parametrize(
    ("options", "tokens", "admitted", "limit"),
    [
        ({"rpm_limit": 1}, 1, 1, "requests"),
        ({"tpm_limit": 10}, 6, 1, "tokens"),
        ({"tpm_limit": 10}, 11, 0, "tokens"),  # larger than the whole limit
        ({"max_concurrent": 1}, 1, 1, "concurrency"),
        ({"monthly_token_quota": 10, "rpm_limit": 0, "tpm_limit": 0}, 11, 0, "quota"),
    ],
)
def test_each_429_is_counted_under_the_limit_that_refused(user, options, tokens, admitted, limit):
    api_key = issue(user, f"limited {limit}", **options).api_key
    before = {
        name: value("completions_rate_limited_total", limit=name)
        for name in ("requests", "tokens", "concurrency", "quota")
    }

    refused(api_key, tokens, admitted)

    after = {name: value("completions_rate_limited_total", limit=name) for name in before}
    assert {name: after[name] - before[name] for name in before} == {name: int(name == limit) for name in before}


def test_redis_down_counts_a_store_error_a_fail_open_period_and_the_local_checks(valid_key, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.API_LIMITS_REDIS_TIMEOUT = 0.2
    settings.API_LIMITS_REDIS_RETRY_SECONDS = 60
    names = (
        "completions_limiter_store_errors_total",
        "completions_limiter_fail_open_periods_total",
        "completions_limiter_fail_open_requests_total",
    )
    before = [value(name) for name in names]

    async def requests():
        async def one(i: int) -> None:
            await (await admit(valid_key.api_key, f"cmpl-{i}", 1)).settle(1)

        await asyncio.gather(*(one(i) for i in range(4)))  # all waiting on Redis when it fails
        for i in range(4, 6):
            await one(i)

    async_to_sync(requests)()

    errors, periods, local = (value(name) - was for name, was in zip(names, before))
    assert periods == 1  # one outage, however many requests saw it begin
    assert 1 <= errors <= 4  # Redis is left alone for 60 s after the failures
    assert local == 6  # each request once
