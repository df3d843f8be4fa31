"""Accounting that loses nothing: one record per request past authentication, whatever its fate.

Driven through the real views in this process (tiny model); the end-to-end versions against a
live server are in ``test_e2e_usage.py`` and ``test_multiprocess.py``.
"""

from __future__ import annotations

import asyncio
import gc

import pytest
from asgiref.sync import async_to_sync

from keys.db import db_call
from keys.models import DailyUsage, UsageRecord
from tests.inprocess_api import apost, body, open_stream, post, tokens_in

pytestmark = pytest.mark.django_db(transaction=True)


async def drop_garbage() -> None:
    await asyncio.sleep(0.01)  # the loop lets go of the finished request's future
    gc.collect()


async def wait_for_record(request_id: str) -> UsageRecord:
    for _ in range(100):
        found = await db_call(lambda: UsageRecord.objects.filter(request_id=request_id).first())
        if found is not None:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no usage record for {request_id}")


def test_every_request_past_authentication_leaves_exactly_one_record(tiny_api, limited_key):
    replies = [
        post(limited_key.plaintext, body()),
        post(limited_key.plaintext, body(stream=True)),
        post(limited_key.plaintext, body(model="nope")),
        post(limited_key.plaintext, body(temperature=9)),
        post(limited_key.plaintext, body(n=2, max_tokens=50)),  # 5 + 2 × 50 reserved: over the 100 a minute
        post(limited_key.plaintext, body()),
    ]

    assert [r.status for r in replies] == [200, 200, 404, 400, 429, 200]
    ids = [r.request_id for r in replies]
    assert sorted(UsageRecord.objects.values_list("request_id", flat=True)) == sorted(ids)


def test_a_record_holds_the_usage_the_response_reported(tiny_api, valid_key):
    answered = post(valid_key.plaintext, body(n=2, user="end-user"))
    streamed = post(valid_key.plaintext, body(stream=True, stream_options={"include_usage": True}))

    for request_id, usage in (
        (answered.request_id, answered.body["usage"]),
        (streamed.request_id, streamed.events[-2]["usage"]),
    ):
        stored = UsageRecord.objects.get(request_id=request_id)
        assert (stored.prompt_tokens, stored.completion_tokens, stored.total_tokens) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            usage["total_tokens"],
        )
    assert UsageRecord.objects.get(request_id=answered.request_id).completion_tokens == 8


def test_a_stream_cut_off_after_its_first_event_leaves_one_interrupted_record_and_frees_its_slot(tiny_api, user):
    from tests.conftest import issue

    one_at_a_time = issue(user, "one at a time", max_concurrent=1)

    async def scenario():
        response = await open_stream(one_at_a_time.plaintext, body(max_tokens=200))
        content = response.streaming_content
        await content.__anext__()  # the first event, then the client goes
        await content.aclose()
        request_id = response["x-request-id"]
        del response, content  # as the server drops a finished request
        await drop_garbage()
        record = await wait_for_record(request_id)
        return record, await apost(one_at_a_time.plaintext, body())

    record, after = async_to_sync(scenario)()

    assert record.finish_reason == "interrupted" and record.stream
    assert 1 <= record.completion_tokens < 200
    assert after.status == 200  # the one concurrency slot is free again


def test_a_stream_the_client_left_records_at_least_the_tokens_it_was_sent(tiny_api, valid_key):
    async def scenario():
        response = await open_stream(valid_key.plaintext, body(max_tokens=200, logprobs=0))
        content = response.streaming_content
        raw = [await content.__anext__() for _ in range(5)]  # five events, then the client goes
        await content.aclose()
        request_id = response["x-request-id"]
        del response, content
        await drop_garbage()
        return await wait_for_record(request_id), tokens_in(raw)

    record, sent = async_to_sync(scenario)()

    assert sent >= 5
    assert (record.status_code, record.finish_reason, record.error_type) == (200, "interrupted", "interrupted")
    assert sent <= record.completion_tokens < 200


def test_a_stream_that_failed_after_its_first_byte_records_the_tokens_it_sent(tiny_api, valid_key, monkeypatch):
    from api.generation import Generation
    from inference.outputs import EngineError

    real_outputs = Generation.outputs

    async def failing_after_three(self):
        steps = 0
        async for item in real_outputs(self):
            yield item
            steps += 1
            if steps == 3:
                raise EngineError("The engine failed.")

    monkeypatch.setattr(Generation, "outputs", failing_after_three)

    async def scenario():
        response = await open_stream(valid_key.plaintext, body(max_tokens=200, logprobs=0))
        raw = [chunk async for chunk in response.streaming_content]
        return response.status_code, raw, await wait_for_record(response["x-request-id"])

    status, raw, record = async_to_sync(scenario)()

    events = [line for line in b"".join(raw).decode().split("\n") if line.startswith("data: ")]
    assert status == 200 and '"error"' in events[-2] and events[-1] == "data: [DONE]"
    sent = tokens_in(raw)
    assert sent >= 3
    assert (record.status_code, record.finish_reason, record.error_type) == (200, "error", "server_error")
    assert sent <= record.completion_tokens < 200


def test_a_stream_dropped_before_its_first_byte_still_leaves_a_record_and_frees_its_reservation(tiny_api, limited_key):
    """A client that leaves while the middleware runs: Django drops the response unstarted."""

    async def scenario():
        response = await open_stream(limited_key.plaintext, body(max_tokens=60))
        request_id = response["x-request-id"]
        del response
        await drop_garbage()
        record = await wait_for_record(request_id)
        after = await apost(limited_key.plaintext, body(max_tokens=70))  # fits only if the 65 were settled
        return record, after

    record, after = async_to_sync(scenario)()

    assert (record.status_code, record.finish_reason, record.error_type) == (499, "interrupted", "interrupted")
    assert after.status == 200
    assert record.total_tokens <= 65


def test_a_retried_request_is_counted_once_per_attempt(tiny_api, valid_key):
    first = post(valid_key.plaintext, body())
    retry = post(valid_key.plaintext, body())  # the client sends the same body again

    assert first.request_id != retry.request_id
    assert UsageRecord.objects.filter(request_id__in=[first.request_id, retry.request_id]).count() == 2
    assert DailyUsage.objects.get(api_key=valid_key.api_key).requests == 2


def test_finishing_an_attempt_twice_writes_one_record_and_settles_once(tiny_api, limited_key):
    from api.accounting import RequestUsage
    from api.auth import admission_headers, admit

    async def scenario():
        usage = RequestUsage(limited_key.api_key, "cmpl-twice", "/v1/completions")
        usage.admission = await admit(limited_key.api_key, "cmpl-twice", 50)
        await usage.finish(200)
        await usage.finish(500, error_type="server_error")
        # 50 were reserved and 0 used, once: all 100 tokens of the minute are free.
        return await admit(limited_key.api_key, "cmpl-next", 100)

    admission = async_to_sync(scenario)()

    assert UsageRecord.objects.get(request_id="cmpl-twice").status_code == 200
    assert admission_headers(admission)["x-ratelimit-remaining-tokens"] == "0"
