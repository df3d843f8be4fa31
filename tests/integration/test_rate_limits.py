"""Per-minute limits and concurrency: what is admitted, what is refused with which 429, and the headers.

The counting rules are one specification run against both counter stores (``limits_store``: this
process's memory, then Redis); the view-level tests drive the real views with the tiny model.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
from asgiref.sync import async_to_sync

from api.auth import admission_headers, admit
from api.errors import APIError
from api.translate import LimitExceeded, format_duration
from keys import limits
from keys.limits import Limits
from keys.models import UsageRecord
from tests.inprocess_api import body, post, post_many

pytestmark = pytest.mark.django_db(transaction=True)

MONTH = "2026-11"


def key_scope(key_id: int, limits_: Limits) -> limits.Scope:
    """Key ``key_id``'s scope (its owner's id the same number), in ``MONTH``."""
    return limits.Scope(limits.KEY, key_id, key_id, limits_, MONTH, MONTH)


def acquire(key_id: int, request_id: str, limits_: Limits, tokens: int, dry_run: bool = False):
    scopes = [key_scope(key_id, limits_)]

    async def call():
        try:
            return (await limits.limiter().acquire(scopes, request_id, tokens, 0, dry_run))[1]
        except limits.TotalsUnknown:
            await limits.limiter().seed(scopes[0], 0, 0)
            return (await limits.limiter().acquire(scopes, request_id, tokens, 0, dry_run))[1]

    return async_to_sync(call)()


def settle(key_id: int, request_id: str, reserved: int, used: int) -> None:
    async def call():
        await limits.limiter().settle([key_scope(key_id, Limits())], request_id, reserved, used)

    async_to_sync(call)()


# --- The counting rules, on both stores ---------------------------------------------------------


def test_requests_beyond_the_rpm_limit_are_refused_with_the_wait_until_the_oldest_leaves(limits_store):
    rpm3 = Limits(rpm=3)
    admitted = [acquire(1, f"r{i}", rpm3, 10) for i in range(3)]
    refused = acquire(1, "r3", rpm3, 10)

    assert [d.refusal for d in admitted] == [None, None, None]
    assert [d.requests for d in admitted] == [1, 2, 3]
    assert refused.refusal == "requests" and refused.requests == 3
    assert 58_000 < refused.retry_after_ms <= 60_000


def test_a_refused_request_counts_for_nothing(limits_store):
    rpm1 = Limits(rpm=1, tpm=100)
    acquire(1, "first", rpm1, 10)

    for attempt in range(3):
        assert acquire(1, f"again{attempt}", rpm1, 10).refusal == "requests"

    peek = acquire(1, "", rpm1, 0, dry_run=True)
    assert (peek.requests, peek.tokens) == (1, 10)


def test_the_window_slides_and_admits_again_once_the_oldest_request_has_left(limits_store, monkeypatch):
    monkeypatch.setattr(limits.decision, "WINDOW_MS", 2000)
    rpm2 = Limits(rpm=2)
    acquire(1, "a", rpm2, 1)
    first = time.monotonic()  # "a" was counted before this
    time.sleep(1.0)
    acquire(1, "b", rpm2, 1)
    assert acquire(1, "c", rpm2, 1).refusal == "requests"

    time.sleep(max(0.0, first + 2.05 - time.monotonic()))  # "a" has left the window; "b" leaves in about 1 s

    assert acquire(1, "d", rpm2, 1).refusal is None
    assert acquire(1, "e", rpm2, 1).refusal == "requests"


def test_tokens_are_reserved_at_admission_so_concurrent_requests_cannot_overshoot_the_tpm(limits_store):
    tpm100 = Limits(tpm=100)

    first, second = acquire(1, "a", tpm100, 40), acquire(1, "b", tpm100, 40)
    third = acquire(1, "c", tpm100, 40)  # nothing generated yet: the reservations alone count
    small = acquire(1, "d", tpm100, 20)

    assert (first.refusal, second.refusal, third.refusal, small.refusal) == (None, None, "tokens", None)
    assert third.tokens == 80 and small.tokens == 100
    assert 58_000 < third.retry_after_ms <= 60_000


def test_settling_gives_back_the_tokens_a_request_did_not_use(limits_store):
    tpm100 = Limits(tpm=100)
    acquire(1, "a", tpm100, 60)
    assert acquire(1, "b", tpm100, 60).refusal == "tokens"

    settle(1, "a", reserved=60, used=15)

    admitted = acquire(1, "b", tpm100, 60)
    assert admitted.refusal is None and admitted.tokens == 75


def test_a_request_larger_than_the_whole_tpm_limit_is_refused_as_too_large(limits_store):
    assert acquire(1, "huge", Limits(tpm=100), 101).refusal == "too_large"


def test_concurrent_requests_beyond_the_limit_wait_for_a_slot_to_be_settled(limits_store):
    two = Limits(max_concurrent=2)
    acquire(1, "a", two, 1)
    acquire(1, "b", two, 1)

    refused = acquire(1, "c", two, 1)
    settle(1, "a", reserved=1, used=1)
    admitted = acquire(1, "c", two, 1)

    assert refused.refusal == "concurrency" and refused.concurrent == 2
    assert admitted.refusal is None and admitted.concurrent == 2


def test_keys_are_counted_apart(limits_store):
    rpm1 = Limits(rpm=1)

    assert acquire(1, "a", rpm1, 1).refusal is None
    assert acquire(2, "b", rpm1, 1).refusal is None
    assert acquire(1, "c", rpm1, 1).refusal == "requests"


def test_a_dimension_without_a_limit_is_not_counted(limits_store):
    unlimited = Limits()

    for i in range(50):
        assert acquire(1, f"r{i}", unlimited, 1000).refusal is None
    assert acquire(1, "", Limits(rpm=1, tpm=1), 0, dry_run=True).requests == 0


def test_the_reset_is_the_time_until_every_counted_request_has_left_the_window(limits_store):
    decision = acquire(1, "a", Limits(rpm=10, tpm=100), 10)

    assert 59_000 < decision.reset_requests_ms <= 60_000
    assert 59_000 < decision.reset_tokens_ms <= 60_000
    assert acquire(2, "", Limits(rpm=10, tpm=100), 0, dry_run=True).reset_requests_ms == 0


# --- What the caller gets -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=False)  # pure: the module's mark would flush the database after it
@pytest.mark.parametrize(
    "ms, text",
    [
        (0, "0s"),
        (17, "17ms"),
        (999, "999ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (7660, "7.66s"),
        (60_000, "1m0s"),
        (360_000, "6m0s"),
        (61_250, "1m1.25s"),
        (3_600_000, "1h0m0s"),
    ],
)
def test_durations_are_written_as_openai_writes_them(ms, text):
    assert format_duration(ms) == text


def test_a_key_without_limits_of_its_own_gets_the_defaults_and_zero_means_none(user, settings):
    from tests.conftest import issue

    settings.API_DEFAULT_RPM, settings.API_DEFAULT_TPM = 7, 700
    default = issue(user, "default").api_key
    own = issue(user, "own", rpm_limit=0, tpm_limit=5, max_concurrent=3, monthly_token_quota=9).api_key

    assert Limits.of(default) == Limits(rpm=7, tpm=700, max_concurrent=0, monthly_tokens=0, budget=0)
    assert Limits.of(own) == Limits(rpm=0, tpm=5, max_concurrent=3, monthly_tokens=9, budget=0)


def refusal_of(api_key, tokens: int, count: int = 1, finish: bool = True) -> LimitExceeded:
    """Admit ``count`` requests of ``tokens`` (finished, unless not ``finish``) and return the next one's refusal."""

    async def scenario():
        for i in range(count):
            admission = await admit(api_key, f"cmpl-{i}", tokens)
            if finish:
                await admission.settle(tokens)
        with pytest.raises(LimitExceeded) as refused:
            await admit(api_key, "cmpl-refused", tokens)
        return refused.value

    return async_to_sync(scenario)()


def test_the_rpm_429_names_the_limit_the_use_and_the_request_and_says_when_to_retry(limited_key, limits_store):
    error = refusal_of(limited_key.api_key, 9, count=3)

    assert (error.status, error.type, error.code, error.param) == (429, "requests", "rate_limit_exceeded", None)
    assert re.fullmatch(
        r"Rate limit reached for requests per min \(RPM\) on this API key: Limit 3, Used 3, Requested 1\. "
        r"Please try again in (5\d(\.\d+)?s|1m0s)\.",
        error.message,
    ), error.message
    assert 58 <= int(error.headers["Retry-After"]) <= 60
    assert 58_000 <= int(error.headers["retry-after-ms"]) <= 60_000
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-should-retry" not in error.headers  # worth retrying, after Retry-After


def test_the_tpm_429_names_the_tokens_used_and_requested(limited_key, limits_store):
    error = refusal_of(limited_key.api_key, 40, count=2)

    assert (error.status, error.type, error.code) == (429, "tokens", "rate_limit_exceeded")
    assert "tokens per min (TPM) on this API key: Limit 100, Used 80, Requested 40." in error.message
    assert error.headers["x-ratelimit-remaining-tokens"] == "20"


def test_a_request_over_the_whole_tpm_limit_is_told_not_to_retry(limited_key, limits_store):
    error = refusal_of(limited_key.api_key, 101, count=0)

    assert error.type == "tokens" and error.headers["x-should-retry"] == "false"
    assert "Request too large for tokens per min (TPM) on this API key: Limit 100, Requested 101." in error.message


def test_the_concurrency_429_counts_requests_in_flight(limited_key, limits_store):
    error = refusal_of(limited_key.api_key, 1, count=2, finish=False)

    assert error.type == "requests"
    assert "concurrent requests on this API key: Limit 2, Used 2, Requested 1." in error.message
    assert error.headers["Retry-After"] == "1"


def test_a_client_that_leaves_during_admission_leaves_nothing_reserved(limited_key, limits_store):
    api_key = limited_key.api_key

    async def scenario():
        task = asyncio.ensure_future(admit(api_key, "cmpl-gone", 50))
        await asyncio.sleep(0)  # the store is being asked
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        return await admit(api_key, "cmpl-next", 100)

    admission = async_to_sync(scenario)()

    assert admission_headers(admission)["x-ratelimit-remaining-tokens"] == "0"  # all 100 were free again


# --- When Redis is down -------------------------------------------------------------------------


@pytest.fixture
def redis_down(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.API_LIMITS_REDIS_TIMEOUT = 0.2
    settings.API_LIMITS_REDIS_RETRY_SECONDS = 60


def test_with_redis_down_limits_fail_open_to_this_process_and_log_it_once(limited_key, redis_down, caplog):
    caplog.set_level(logging.ERROR, logger="keys.limits")

    error = refusal_of(limited_key.api_key, 1, count=2, finish=False)  # still limited, by this process's counters

    assert error.type == "requests"  # the concurrency limit, 2, counted here
    unavailable = [r for r in caplog.records if "is unavailable" in r.getMessage()]
    assert len(unavailable) == 1
    assert "each process enforces the limits alone (fail open)" in unavailable[0].getMessage()


def test_with_redis_down_and_fail_mode_closed_requests_get_a_503(limited_key, redis_down, settings):
    settings.API_LIMITS_FAIL_MODE = "closed"

    async def scenario():
        with pytest.raises(APIError) as refused:
            await admit(limited_key.api_key, "cmpl-1", 1)
        return refused.value

    error = async_to_sync(scenario)()

    assert (error.status, error.code) == (503, "limiter_unavailable")
    assert error.headers["Retry-After"] == "60"


def test_a_fail_open_server_still_answers_with_redis_down(tiny_api, valid_key, redis_down):
    reply = post(valid_key.plaintext, body())

    assert reply.status == 200
    assert reply.headers["x-ratelimit-limit-requests"] == "60000"


# --- Through the API ----------------------------------------------------------------------------


def test_every_completion_response_carries_openais_rate_limit_headers(tiny_api, limited_key, limits_store):
    answered = post(limited_key.plaintext, body())
    streamed = post(limited_key.plaintext, body(stream=True))
    rejected = post(limited_key.plaintext, body(temperature=9))

    for reply in (answered, streamed, rejected):
        assert reply.headers["x-ratelimit-limit-requests"] == "3"
        assert reply.headers["x-ratelimit-limit-tokens"] == "100"
        assert reply.headers["x-request-id"].startswith("cmpl-")
        assert reply.headers["x-ratelimit-reset-requests"].endswith("s")
    assert answered.headers["x-ratelimit-remaining-requests"] == "2"
    assert answered.headers["x-ratelimit-remaining-tokens"] == str(100 - 9)  # 5 prompt + 4 reserved, all used
    assert streamed.headers["x-ratelimit-remaining-requests"] == "1"
    assert rejected.status == 400
    assert rejected.headers["x-ratelimit-remaining-requests"] == "1"  # a 400 is read, not counted


def test_the_fourth_request_in_a_minute_gets_a_429_and_a_record_without_tokens(tiny_api, limited_key, limits_store):
    replies = [post(limited_key.plaintext, body()) for _ in range(4)]

    assert [r.status for r in replies] == [200, 200, 200, 429]
    assert replies[3].error["code"] == "rate_limit_exceeded" and replies[3].error["type"] == "requests"
    assert replies[3].headers["retry-after"]
    record = UsageRecord.objects.get(request_id=replies[3].request_id)
    assert (record.status_code, record.error_type, record.total_tokens) == (429, "requests", 0)


def test_concurrent_requests_over_the_tpm_limit_are_refused_before_generation(tiny_api, user, limits_store):
    from tests.conftest import issue

    key = issue(user, "tpm", tpm_limit=45, rpm_limit=0)  # five requests of 9 tokens
    replies = post_many(key.plaintext, [body() for _ in range(8)])

    assert sorted(r.status for r in replies) == [200] * 5 + [429] * 3
    used = sum(r.body["usage"]["total_tokens"] for r in replies if r.status == 200)
    assert used == 45


def test_an_unauthenticated_request_gets_a_request_id_but_no_rate_limit_headers(tiny_api, db):
    reply = post("sk-cs-AAAAAAAA.nope", body())

    assert reply.status == 401
    assert reply.headers["x-request-id"].startswith("cmpl-")
    assert not any(name.startswith("x-ratelimit") for name in reply.headers)
