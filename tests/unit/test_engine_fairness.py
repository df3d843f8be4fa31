"""Prefill turns: a request of many prompts does not hold up the first token of the requests behind it,
and scoring requests are prefilled together with the results they get alone (float32)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inference.sampling import SamplingParams
from testing.tiny_engine import start_tiny_engine

BIG_PROMPTS = 8
BIG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 5  # 225 tokens of the tiny tokenizer


@pytest.fixture(scope="module")
def engine():
    engine = start_tiny_engine(max_batch_size=16, prefill_chunk=16)
    yield engine
    engine.stop()


def test_a_short_request_behind_a_big_one_gets_its_first_token_before_the_big_one_is_prefilled(engine):
    firsts: list[str] = []  # request ids in the order their first output arrived

    async def consume(stream):
        async for output in stream:
            if output.outputs and stream.request_id not in firsts:
                firsts.append(stream.request_id)

    # The engine takes its inbox only once every request is in, as if they came at once: on a busy
    # machine it could otherwise prefill the first big prompts before "small" was even submitted.
    submitted = threading.Event()
    take_inbox = engine._take_inbox

    def take_when_submitted() -> None:
        submitted.wait(30)
        take_inbox()

    async def main():
        params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        big = [engine.submit(f"big-{i}", engine.encode(BIG_PROMPT), params, group="big") for i in range(BIG_PROMPTS)]
        small = engine.submit("small", engine.encode("Hi"), params, group="small")
        submitted.set()
        await asyncio.gather(*(consume(stream) for stream in [*big, small]))

    engine._take_inbox = take_when_submitted
    try:
        asyncio.run(main())
    finally:
        del engine._take_inbox
    assert len(firsts) == BIG_PROMPTS + 1
    # In order of submission (first come, first served) "small" would come last.
    assert firsts.index("small") < firsts.index(f"big-{BIG_PROMPTS - 1}")
    assert firsts.index("small") < BIG_PROMPTS // 2


def test_scoring_requests_prefilled_together_get_the_logprobs_they_get_alone(engine):
    prompts = ["Hello, world!", "abc", "The cat sat on the mat.", "0123456789 " * 4, "Why?", "no no no"]
    params = SamplingParams(max_tokens=0, logprobs=2, prompt_logprobs=True)
    calls: list[int] = []  # all-logits chunks per prefill call
    runner = engine.runner
    prefill = runner.prefill

    def spy(chunks):
        calls.append(sum(chunk.all_logits for chunk in chunks))
        return prefill(chunks)

    async def score(request_id, prompt):
        outputs = [output async for output in engine.submit(request_id, engine.encode(prompt), params)]
        return outputs[0].prompt_logprobs

    async def together():
        return await asyncio.gather(*(score(f"t{i}", prompt) for i, prompt in enumerate(prompts)))

    alone = [asyncio.run(score(f"a{i}", prompt)) for i, prompt in enumerate(prompts)]
    runner.prefill = spy
    try:
        batched = asyncio.run(together())
    finally:
        del runner.prefill
    assert max(calls) > 1  # several scoring prompts in one prefill call
    # Equal up to float32 rounding: left padding changes the order of attention's sums (the
    # longest prompt, unpadded, comes out bit for bit the same).
    for got, want in zip(batched, alone):
        assert [entry.token_id for entry in got] == [entry.token_id for entry in want]
        assert [entry.logprob for entry in got] == pytest.approx([entry.logprob for entry in want], abs=1e-5)
        assert [[token for token, _ in entry.top] for entry in got] == [
            [token for token, _ in entry.top] for entry in want
        ]
        for entry_got, entry_want in zip(got, want):
            assert [v for _, v in entry_got.top] == pytest.approx([v for _, v in entry_want.top], abs=1e-5)
