"""A prompt's first tokens go out before its cache joins the running batch (inference/engine.py's
_prefill): a join that then fails fails the request once, after its first token, and a request
that finished on its first token keeps its one, finished output."""

from __future__ import annotations

import asyncio

import pytest

from inference.engine import EngineError
from inference.sampling import SamplingParams
from testing.tiny_engine import run_one, start_tiny_engine


@pytest.fixture
def engine():
    engine = start_tiny_engine(max_batch_size=8)
    yield engine
    engine.stop()


def _failing_join(engine, fail_copies):
    runner = engine._loaded_runner
    real = runner.join
    calls: list[int] = []

    def join(key, copies):
        calls.append(copies)
        if copies in fail_copies:
            raise RuntimeError("no memory for the batch's cache")
        real(key, copies)

    runner.join = join
    return calls, lambda: runner.__dict__.pop("join")


async def _collect(stream):
    outputs, error = [], None
    try:
        async for output in stream:
            outputs.append(output)
    except EngineError as failure:
        error = failure
    return outputs, error


@pytest.mark.parametrize("n", [1, 2])
def test_a_failing_join_fails_a_live_request_once_after_its_first_token(engine, n):
    calls, restore = _failing_join(engine, fail_copies={1, 2})

    async def main():
        stream = engine.submit(
            "live", engine.encode("abc"), SamplingParams(max_tokens=4, n=n, best_of=n, ignore_eos=True)
        )
        outputs, error = await asyncio.wait_for(_collect(stream), 30)
        await asyncio.sleep(0.2)  # anything pushed after the error would be queued by now
        return outputs, error, stream._request.queue.qsize()

    outputs, error, left = asyncio.run(main())
    restore()
    assert calls == [n]
    assert error is not None
    assert [len(c.token_ids) for o in outputs for c in o.outputs] == [1] * n and not outputs[-1].finished
    assert left == 0  # one error event, not two
    assert run_one(engine, "abc", max_tokens=3, ignore_eos=True).num_tokens == 3  # serving goes on


def test_a_request_finished_on_its_first_token_sees_no_error_from_a_failing_join(engine):
    calls, restore = _failing_join(engine, fail_copies={0})

    async def main():
        stream = engine.submit("one", engine.encode("abc"), SamplingParams(max_tokens=1, ignore_eos=True))
        outputs, error = await asyncio.wait_for(_collect(stream), 30)
        await asyncio.sleep(0.2)
        return outputs, error, stream._request.queue.qsize()

    outputs, error, left = asyncio.run(main())
    restore()
    assert calls == [0]
    assert error is None and outputs[-1].finished and outputs[-1].outputs[0].num_tokens == 1
    assert left == 0
    assert engine.stats()["running"] == 0
    assert run_one(engine, "abc", max_tokens=3, ignore_eos=True).num_tokens == 3
