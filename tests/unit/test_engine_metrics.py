"""The engine's Prometheus metrics move by what it did: tokens, requests, histograms, gauges."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from testing.tiny_engine import run_many, run_one, start_tiny_engine


@pytest.fixture(scope="module")
def engine():
    engine = start_tiny_engine(max_batch_size=8, prefill_chunk=16)
    yield engine
    engine.stop()


def value(name: str, **labels: str) -> float:
    """A sample of the tiny engine's (its ``model_name`` label is its model id)."""
    return REGISTRY.get_sample_value(name, {"model_name": "tiny", **labels}) or 0.0


def snapshot() -> dict[str, float]:
    return {
        "prompt": value("completions_prompt_tokens_total"),
        "generation": value("completions_generation_tokens_total"),
        "length": value("completions_request_success_total", finish_reason="length"),
        "ttft": value("completions_time_to_first_token_seconds_count"),
        "tpot": value("completions_time_per_output_token_seconds_count"),
        "e2e": value("completions_e2e_request_latency_seconds_count"),
        "queue": value("completions_request_queue_time_seconds_count"),
        "decode": value("completions_decode_step_duration_seconds_count"),
        "prefill": value("completions_prefill_step_duration_seconds_count"),
    }


def moved(before: dict[str, float]) -> dict[str, float]:
    after = snapshot()
    return {name: after[name] - before[name] for name in after}


def test_one_request_moves_each_counter_by_its_tokens_and_each_histogram_once(engine):
    prompt = "Hello, world!"
    before = snapshot()
    run_one(engine, prompt, max_tokens=6, temperature=0, ignore_eos=True)
    delta = moved(before)
    assert delta["prompt"] == len(engine.encode(prompt))
    assert delta["generation"] == 6
    assert delta["length"] == 1
    assert (delta["ttft"], delta["tpot"], delta["e2e"], delta["queue"]) == (1, 1, 1, 1)
    assert delta["decode"] == 5  # the first token is sampled at the prefill
    assert delta["prefill"] >= 1


def test_a_request_with_candidates_counts_their_tokens_and_finishes_once(engine):
    before = snapshot()
    run_one(engine, "abc", max_tokens=4, n=3, best_of=3, temperature=1.0, ignore_eos=True)
    delta = moved(before)
    assert delta["generation"] == 12
    assert delta["length"] == 1  # once per request, as vLLM counts
    assert delta["e2e"] == 1


def test_requests_failed_by_an_engine_error_count_as_error(engine):
    import asyncio

    from inference.engine import EngineError
    from inference.sampling import SamplingParams

    before = value("completions_request_success_total", finish_reason="error")

    async def fail_after_first_output():
        stream = engine.submit("failed", engine.encode("Hello"), SamplingParams(max_tokens=500, ignore_eos=True))
        await stream.__anext__()
        original = engine._decode_step

        def broken() -> None:
            engine._decode_step = original
            raise RuntimeError("boom")

        engine._decode_step = broken
        with pytest.raises(EngineError):
            async for _ in stream:
                pass

    asyncio.run(fail_after_first_output())
    assert value("completions_request_success_total", finish_reason="error") == before + 1


def test_the_gauges_go_back_to_zero_when_the_batch_empties(engine):
    run_many(engine, [("x", {"max_tokens": 8, "ignore_eos": True}), ("y", {"max_tokens": 3, "ignore_eos": True})])
    deadline = time.monotonic() + 5
    while value("completions_num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert value("completions_num_requests_running") == 0
    assert value("completions_num_requests_waiting") == 0
    assert value("completions_kv_cache_columns_in_use") == 0


def test_an_aborted_request_counts_once_as_abort(engine):
    import asyncio

    from inference.sampling import SamplingParams

    before = value("completions_request_success_total", finish_reason="abort")

    async def abort_after_first_output():
        stream = engine.submit("aborted", engine.encode("Hello"), SamplingParams(max_tokens=500, ignore_eos=True))
        await stream.__anext__()
        stream.abort()

    asyncio.run(abort_after_first_output())
    deadline = time.monotonic() + 5
    while value("completions_request_success_total", finish_reason="abort") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert value("completions_request_success_total", finish_reason="abort") == before + 1
    # The aborted request was the last running one: the gauges go back to zero without another step.
    while value("completions_num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert value("completions_num_requests_running") == 0
    assert value("completions_num_requests_waiting") == 0
    assert value("completions_kv_cache_columns_in_use") == 0
