"""The engine's batch: rows never influence each other; aborts and limits behave."""

from __future__ import annotations

import asyncio

import pytest

from inference.engine import EngineOverloaded
from inference.sampling import SamplingParams
from testing.tiny_engine import run, run_many, run_one, start_tiny_engine

PROMPTS = ["Hello, world!", "abc", "The cat sat on the mat.", "x", "0123456789 " * 5, "Why?", "Yes", "no no no"]


@pytest.fixture(scope="module")
def engine():
    engine = start_tiny_engine(max_batch_size=8, prefill_chunk=16)
    yield engine
    engine.stop()


def test_concurrent_greedy_requests_each_get_the_text_they_get_alone(engine):
    params = {"max_tokens": 24, "temperature": 0, "ignore_eos": True}
    alone = [run_one(engine, prompt, **params).text for prompt in PROMPTS]
    together = [result.text for result in run_many(engine, [(prompt, params) for prompt in PROMPTS])]
    assert together == alone


def test_seeded_sampling_repeats_exactly_whatever_runs_beside_it(engine):
    params = {"max_tokens": 24, "temperature": 1.0, "seed": 42, "ignore_eos": True}
    alone = run_one(engine, PROMPTS[0], **params).text
    crowd = [(p, {"max_tokens": 24, "temperature": 1.0, "ignore_eos": True}) for p in PROMPTS[1:]]
    together = run_many(engine, [(PROMPTS[0], params), *crowd])[0].text
    assert together == alone


def test_a_biased_request_beside_a_plain_one_changes_only_itself(engine):
    plain = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
    forced_id = engine.encode("z")[0]
    biased = {**plain, "logit_bias": {forced_id: 100.0}, "presence_penalty": 1.5}
    alone = run_one(engine, PROMPTS[1], **plain).text
    results = run_many(engine, [(PROMPTS[1], plain), (PROMPTS[1], biased)])
    assert results[0].text == alone
    assert results[1].text == "z" * 16  # +100 forces the token


def test_a_banned_token_never_appears(engine):
    text = run_one(engine, PROMPTS[0], max_tokens=30, temperature=0, ignore_eos=True).text
    banned = text[0]
    again = run_one(
        engine, PROMPTS[0], max_tokens=30, temperature=0, ignore_eos=True, logit_bias={engine.encode(banned)[0]: -100.0}
    ).text
    assert banned not in again


def test_n_candidates_share_the_prompt_and_sample_independently(engine):
    results = asyncio.run(
        run(engine, PROMPTS[2], SamplingParams(max_tokens=12, temperature=1.0, n=3, best_of=3, seed=1, ignore_eos=True))
    )
    assert sorted(results) == [0, 1, 2]
    assert len({r.text for r in results.values()}) > 1
    assert all(r.num_tokens == 12 for r in results.values())


def test_long_prompts_are_prefilled_in_chunks_with_the_same_result(engine):
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 3  # 135 tokens, chunks of 16
    params = {"max_tokens": 10, "temperature": 0, "ignore_eos": True}
    chunked = run_one(engine, long_prompt, **params).text
    import torch

    ids = torch.tensor([engine.encode(long_prompt)])
    with torch.inference_mode():
        reference = engine.model.generate(ids, max_new_tokens=10, do_sample=False)
    assert chunked == engine.decode(reference[0, ids.shape[1] :].tolist())


def test_an_aborted_request_leaves_the_batch_before_the_next_step(engine):
    async def main():
        stream = engine.submit(
            "abort-me", engine.encode("abc"), SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
        )
        await stream.__anext__()
        stream.abort()
        for _ in range(100):
            if engine.stats()["running"] == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())


def test_a_full_queue_refuses_new_requests_at_once():
    small = start_tiny_engine(max_batch_size=1, max_queue=2)
    try:

        async def main():
            params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
            streams = [small.submit(f"q{i}", small.encode("abc"), params) for i in range(2)]
            with pytest.raises(EngineOverloaded):
                for i in range(5):
                    streams.append(small.submit(f"extra{i}", small.encode("abc"), params))
            for stream in streams:
                stream.abort()

        asyncio.run(main())
    finally:
        small.stop()


def test_one_requests_prompts_are_queued_all_or_none_and_prefilled_in_one_pass():
    small = start_tiny_engine(max_batch_size=8, max_queue=3)
    try:

        async def main():
            params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
            with pytest.raises(EngineOverloaded):
                small.submit_many([(f"p{i}", small.encode("abc")) for i in range(4)], params, group="four")
            assert len(small.scheduler) + len(small._inbox) == 0  # none of the four was queued
            passes = small.scheduler._passes
            streams = small.submit_many([("a", small.encode("abc")), ("b", small.encode("Hello there"))], params)
            for stream in streams:
                assert len([output async for output in stream]) >= 1
            return small.scheduler._passes - passes

        assert asyncio.run(main()) == 1  # the worker saw both prompts at once: one prefill pass
    finally:
        small.stop()


def test_max_tokens_zero_scores_the_prompt_without_generating(engine):
    results = asyncio.run(run(engine, "abc", SamplingParams(max_tokens=0, logprobs=0, prompt_logprobs=True)))
    assert results[0].text == "" and results[0].num_tokens == 0 and results[0].finish_reason == "length"


def test_a_vanishing_temperature_is_greedy_and_harms_no_neighbour(engine):
    greedy = run_one(engine, PROMPTS[0], max_tokens=12, temperature=0, ignore_eos=True).text
    results = run_many(
        engine,
        [
            (PROMPTS[0], {"max_tokens": 12, "temperature": 1e-40, "ignore_eos": True}),
            (PROMPTS[1], {"max_tokens": 12, "temperature": 0, "ignore_eos": True}),
        ],
    )
    assert results[0].text == greedy
    assert results[1].finish_reason == "length"
