"""The drain's bookkeeping (``api/draining.py``): what a process waits for after SIGTERM."""

from __future__ import annotations

import asyncio
import gc

from api.draining import DrainState, refusal_error


class Usage:
    """Stands in for a request's ``RequestUsage``."""


def test_a_draining_process_refuses_with_503_retry_after_in_openais_shape():
    error = refusal_error()

    assert error.status == 503 and error.headers == {"Retry-After": "1"}
    assert set(error.to_dict()["error"]) == {"message", "type", "param", "code"}
    assert error.type == "server_error" and error.code == "server_shutting_down"


def test_the_state_is_idle_once_every_open_request_has_written_its_record():
    async def scenario() -> list[bool]:
        state, usage, written = DrainState(), Usage(), asyncio.Event()
        state.opened(usage)
        seen = [state.idle()]
        state.closed(usage)
        state.writing(written.wait())
        seen.append(state.idle())
        written.set()
        seen.append(await state.wait_idle(1))
        return seen

    assert asyncio.run(scenario()) == [False, False, True]


def test_waiting_for_idle_ends_at_the_timeout_or_when_interrupted():
    async def scenario() -> tuple[bool, bool]:
        state, usage, hurry = DrainState(), Usage(), asyncio.Event()
        state.opened(usage)
        timed_out = await state.wait_idle(0.1)
        hurry.set()
        interrupted = await state.wait_idle(60, hurry)
        return timed_out, interrupted

    assert asyncio.run(scenario()) == (False, False)


def test_a_request_object_that_is_gone_is_not_waited_for():
    # Weak references: a dropped response's RequestUsage accounts for itself in __del__.
    state = DrainState()
    state.opened(Usage())
    gc.collect()
    assert state.idle()


def test_begin_is_idempotent_and_keeps_the_first_time():
    state = DrainState()
    state.begin()
    since = state.since
    state.begin()
    assert state.draining and state.since == since


def test_an_api_request_is_waited_for_until_its_last_byte_is_sent():
    from api import access, draining

    async def scenario() -> list[int]:
        seen: list[int] = []
        body_may_go = asyncio.Event()

        async def app(scope, receive, send):  # a JSON answer after its usage record was written
            await send({"type": "http.response.start", "status": 200, "headers": []})
            seen.append(draining.state.open_requests)
            await body_may_go.wait()
            await send({"type": "http.response.body", "body": b"{}"})

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            pass

        before = draining.state.open_requests
        scope = {"type": "http", "path": "/v1/completions", "method": "POST", "headers": []}
        served = asyncio.ensure_future(access.AccessLog(app)(scope, receive, send))
        await asyncio.sleep(0.01)
        body_may_go.set()
        await served
        return [seen[0] - before, draining.state.open_requests - before]

    assert asyncio.run(scenario()) == [1, 0]


def test_a_request_with_a_pending_usage_record_counts_once_and_keeps_the_process_until_recorded():
    class Usage:  # what api/accounting.py's RequestUsage tells the drain
        pass

    state = DrainState()
    usage = Usage()
    with state.serving():
        state.opened(usage)
        assert state.open_requests == 1  # one request, not one for its serving and one for its record
    assert not state.idle()  # its record is not begun yet
    state.closed(usage)
    assert state.idle()
