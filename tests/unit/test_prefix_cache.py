"""Prefix caching (inference.prefix_cache and LlamaModelRunner.reuse_prefix): a prompt that begins
as one prefilled before reuses its keys and values, and its logits are those of a prefill from
scratch (float64: exactly, as the runner's other tests hold it to transformers)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from inference.llama import LlamaModelRunner
from inference.model_runner import PrefillChunk
from inference.prefix_cache import BLOCK_TOKENS, PrefixCache
from testing.tiny_model import tiny_model

VOCAB = 70


def entry(tokens: int, width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of ``tokens`` positions, ``[1 layer, 1 head, tokens, width]`` float32 (16 bytes a position each)."""
    return torch.zeros(1, 1, tokens, width), torch.zeros(1, 1, tokens, width)


def test_lookup_finds_the_whole_prompt_or_the_longest_shared_run_of_whole_blocks():
    cache = PrefixCache(1 << 20)
    stored = list(range(40))
    assert cache.store(stored, *entry(40))
    assert cache.lookup(stored)[1] == 40  # the same prompt again
    assert cache.lookup(stored + [7, 8])[1] == 40  # a longer prompt
    assert cache.lookup(stored[:35])[1] == 35  # a shorter one
    assert cache.lookup(stored[:20] + [99] * 20)[1] == 20  # diverging in the second block
    assert cache.lookup([99] + stored[1:]) is None  # diverging at once
    assert cache.lookup(stored[: BLOCK_TOKENS - 1]) is None  # no whole block, not stored as it is
    assert not cache.store(stored, *entry(40))  # stored already


def test_a_shared_prefix_is_still_found_when_the_latest_prompt_holding_it_is_evicted():
    system = list(range(100, 164))  # 64 tokens, four blocks, shared by two conversations
    per_prompt = 2 * 67 * 4 * 4
    cache = PrefixCache(4 * per_prompt)
    assert cache.store(system + [1, 2, 3], *entry(67)) and cache.store(system + [4, 5, 6], *entry(67))
    cache.lookup(system + [1, 2, 3])  # the first is now the most recent: the second goes first
    cache.shrink(per_prompt)
    assert len(cache) == 1
    found = cache.lookup(system + [7, 8, 9])
    assert found is not None and found[1] == 64 and found[0].token_ids[-1] == 3


def test_a_hash_collision_is_not_taken_for_a_match(monkeypatch):
    cache = PrefixCache(1 << 20)
    cache.store(list(range(16)), *entry(16))
    monkeypatch.setattr("inference.prefix_cache.block_hashes", lambda tokens: [1] * (len(tokens) // 16))
    cache.store(list(range(100, 116)), *entry(16))  # both entries' block now "hashes" alike
    assert cache.lookup(list(range(16)) + [5]) is None  # the block points at the other prompt


def test_least_recently_used_prompts_go_first_and_big_ones_are_not_kept():
    per_prompt = 2 * 16 * 4 * 4  # keys and values of 16 positions, width 4, float32
    cache = PrefixCache(3 * per_prompt)
    prompts = [[i] * 16 for i in range(4)]
    for prompt in prompts[:3]:
        assert cache.store(prompt, *entry(16))
    cache.lookup(prompts[0])  # used again: now the most recent
    assert cache.store(prompts[3], *entry(16))  # evicts prompts[1], the least recently used
    assert cache.lookup(prompts[1]) is None
    assert all(cache.lookup(p) is not None for p in (prompts[0], prompts[2], prompts[3]))
    assert cache.nbytes == 3 * per_prompt
    assert not cache.store([9] * 32, *entry(32))  # more than half the budget
    cache.shrink(per_prompt)
    assert len(cache) == 1 and cache.nbytes == per_prompt
    assert not PrefixCache(0).store([1, 2], *entry(2))


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(vocab_size=VOCAB).double()


def prefill_whole(runner, key: int, ids: list[int]) -> torch.Tensor:
    (logits,) = runner.prefill([PrefillChunk(key, ids, 0, False)])
    return logits


@pytest.mark.parametrize("new_tokens", [0, 5, 40], ids=["the same prompt", "5 more tokens", "40 more tokens"])
def test_a_reused_prefix_gives_the_logits_of_a_prefill_from_scratch(tiny, new_tokens):
    generator = torch.Generator().manual_seed(3)
    first = torch.randint(0, VOCAB, (37,), generator=generator).tolist()
    second = first + torch.randint(0, VOCAB, (new_tokens,), generator=generator).tolist()
    runner = LlamaModelRunner(tiny, dtype=torch.float64, prefix_cache_bytes=64 << 20)
    reference = LlamaModelRunner(tiny, dtype=torch.float64)
    with torch.inference_mode():
        assert runner.reuse_prefix(1, first) == 0  # nothing stored yet
        prefill_whole(runner, 1, first)
        runner.join(1, 1)  # the prompt is stored as it joins the batch
        reused = runner.reuse_prefix(2, second)
        assert reused == (36 if new_tokens == 0 else 37)
        (logits,) = runner.prefill([PrefillChunk(2, second[reused:], reused, False)])
        runner.join(2, 1)
        expected = prefill_whole(reference, 2, second)
        torch.testing.assert_close(logits, expected, atol=1e-10, rtol=2**-24)
        # Both rows decode on from there like rows prefilled from scratch.
        reference.join(2, 1)
        torch.testing.assert_close(runner.decode([3, 4])[1:], reference.decode([4]), atol=1e-10, rtol=2**-24)


@pytest.mark.parametrize("kv_cache_dtype", [torch.float16, torch.float32])
def test_a_prefix_stored_and_joined_by_our_kernels_copy_gives_the_logits_of_a_prefill_from_scratch(kv_cache_dtype):
    # Float32 activations: our CPU kernels copy a joined prompt's cache into the batch and into the
    # prefix cache (where they run); the copies must hold the very values the prefill wrote.
    from inference import cpu_kernels

    if cpu_kernels.load(None) is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    model = tiny_model(vocab_size=VOCAB)
    generator = torch.Generator().manual_seed(4)
    first = torch.randint(0, VOCAB, (37,), generator=generator).tolist()
    second = first + torch.randint(0, VOCAB, (5,), generator=generator).tolist()
    runner = LlamaModelRunner(model, dtype=torch.float32, kv_cache_dtype=kv_cache_dtype, prefix_cache_bytes=64 << 20)
    # The reference copies with torch (no kernels): a wrong copy must not be compared with itself.
    reference = LlamaModelRunner(model, dtype=torch.float32, kv_cache_dtype=kv_cache_dtype, kernels=None)
    assert runner._kernels is not None and reference._kernels is None
    with torch.inference_mode():
        prefill_whole(runner, 1, first)
        runner.join(1, 2)  # two rows (n=2) of one prompt
        reused = runner.reuse_prefix(2, second)
        assert reused == 37
        (logits,) = runner.prefill([PrefillChunk(2, second[reused:], reused, False)])
        runner.join(2, 1)
        torch.testing.assert_close(logits, prefill_whole(reference, 2, second), atol=1e-4, rtol=1e-4)
        prefill_whole(reference, 1, first)
        reference.join(1, 2)
        reference.join(2, 1)
        torch.testing.assert_close(runner.decode([3, 4, 5]), reference.decode([3, 4, 5]), atol=1e-4, rtol=1e-4)


def test_reuse_is_off_at_budget_zero_and_forgotten_on_release_and_reset(tiny):
    ids = list(range(1, 30))
    with torch.inference_mode():
        off = LlamaModelRunner(tiny, dtype=torch.float64)
        prefill_whole(off, 1, ids)
        off.join(1, 1)
        assert off.reuse_prefix(2, ids) == 0
        runner = LlamaModelRunner(tiny, dtype=torch.float64, prefix_cache_bytes=64 << 20)
        prefill_whole(runner, 1, ids)
        runner.join(1, 0)  # a scoring request (no rows) is stored too
        assert runner.cache_bytes > 0
        assert runner.reuse_prefix(2, ids) == len(ids) - 1
        with pytest.raises(ValueError, match="starts at 3 but 28 positions"):
            runner.prefill([PrefillChunk(2, ids[3:], 3, False)])
        runner.release(2)
        runner.prefill([PrefillChunk(2, ids, 0, False)])  # after release it starts from scratch
        runner.reset()
        assert runner.reuse_prefix(3, ids) == 0 and runner.cache_bytes == 0


def test_stored_prompts_give_way_to_the_running_rows(tiny):
    """The budget is shared: running rows whose positions take it all leave no stored prompt, and
    rows holding less leave the rest (a prompt joining the batch is stored beside its own row)."""
    runner = LlamaModelRunner(tiny, dtype=torch.float64, prefix_cache_bytes=1 << 20)
    with torch.inference_mode():
        prefill_whole(runner, 1, list(range(1, 40)))
        runner.join(1, 1)
        assert len(runner._prefix_cache) == 1
        runner.prefill([PrefillChunk(2, list(range(2, 40)), 0, False)])
        runner.join(2, 40)  # 41 rows of about 38 positions, 1 KB each: more than the budget
    assert len(runner._prefix_cache) == 0
    with torch.inference_mode():
        runner.keep([0])
        runner.prefill([PrefillChunk(3, list(range(3, 40)), 0, False)])
        runner.join(3, 1)  # two rows: room again, and the new prompt is stored
    assert len(runner._prefix_cache) == 1


def test_the_engine_reuses_a_prompt_sent_again_and_generates_the_same_text():
    """End to end through the engine (the tiny model, float32, prefix caching on): the second
    request prefills only its last token, and greedy decoding goes the same way; a prompt
    log-probability request never reuses (it needs every position's logits)."""
    from inference.sampling import SamplingParams
    from testing.tiny_engine import run, run_one, start_tiny_engine

    engine = start_tiny_engine(prefix_caching="on", prefill_chunk=16)

    def hits() -> float:
        return engine.metrics.prefix_cache_hits._value.get()

    def prefill_passes() -> float:
        (metric,) = engine.metrics.prefill_step_duration.collect()
        return sum(sample.value for sample in metric.samples if sample.name.endswith("_count"))

    try:
        prompt = "The cat sat on the mat, and then the dog sat on the cat. " * 2
        length = len(engine.encode(prompt))
        params = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
        before = hits()
        first = run_one(engine, prompt, **params)
        assert hits() == before
        passes = prefill_passes()
        again = run_one(engine, prompt, **params)
        assert hits() == before + length - 1
        assert prefill_passes() == passes  # its last token went through a decode step instead
        assert again.token_ids == first.token_ids
        run_one(engine, prompt, max_tokens=1, prompt_logprobs=1)
        assert hits() == before + length - 1
        # Started straight in the batch (its last token decoded there), seeded candidates sample
        # as they do from a prefill pass's logits.
        seeded = {"max_tokens": 6, "temperature": 1.0, "seed": 7, "n": 2, "best_of": 2, "ignore_eos": True}
        other = "A prompt of another kind, long enough to be stored on its own, or so one hopes."
        alone = asyncio.run(run(engine, other, SamplingParams(**seeded)))
        reused = asyncio.run(run(engine, other, SamplingParams(**seeded)))
        assert [r.token_ids for r in reused.values()] == [r.token_ids for r in alone.values()]
        assert all(r.num_tokens == 6 for r in reused.values())
    finally:
        engine.stop()


def test_requests_waiting_behind_a_shared_prefix_reuse_it_once_it_is_stored():
    """Arrived together on an empty cache (one API request's prompts), requests that wait (here for
    the one row of the batch) look again once the first one's prompt is stored, and reuse it."""
    from inference.sampling import SamplingParams
    from testing.tiny_engine import start_tiny_engine

    engine = start_tiny_engine(prefix_caching="on", max_batch_size=1)
    hits = engine.metrics.prefix_cache_hits._value
    try:
        shared = "A long shared instruction that every request begins with, word for word. " * 3
        prompts = [
            (f"r{i}", engine.encode(shared + ending)) for i, ending in enumerate(("First?", "Second?", "Third?"))
        ]
        before = hits.get()

        async def main():
            streams = engine.submit_many(prompts, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
            return [[output async for output in stream] for stream in streams]

        outputs = asyncio.run(main())
        assert all(stream[-1].finished for stream in outputs)
        shared_tokens = len(engine.encode(shared)) - 1
        assert hits.get() - before >= 2 * shared_tokens
    finally:
        engine.stop()
