"""A worker thread that fails outside a step does not leave the engine saying it is ready: /healthz
turns 503 with the error, and the requests in it fail instead of waiting for ever (inference/engine.py)."""

import asyncio

import pytest

from inference.engine import EngineError
from inference.sampling import SamplingParams
from testing.tiny_engine import start_tiny_engine


class BrokenBudget:
    """A thread budget whose reading raises (an unreadable /proc, say)."""

    share = threads_share = 0.0

    def update(self):
        raise ValueError("unreadable")


def test_a_failing_worker_reports_the_error_and_fails_its_requests():
    engine = start_tiny_engine()
    try:
        engine._thread_budget = BrokenBudget()

        async def submit_and_wait():
            stream = engine.submit("r1", [1, 2, 3], SamplingParams(max_tokens=4))
            return [output async for output in stream]

        with pytest.raises(EngineError):
            asyncio.run(asyncio.wait_for(submit_and_wait(), timeout=30))
        assert not engine.ready
        assert isinstance(engine.load_error, ValueError)
    finally:
        engine.stop()
