"""The transformers model runner alone: batched, chunked and joined passes compute what one pass does."""

from __future__ import annotations

import pytest
import torch

from inference.model_runner import HFModelRunner, PrefillChunk, build_runner
from testing.tiny_model import tiny_model

VOCAB = 72


@pytest.fixture(scope="module")
def model():
    return tiny_model(VOCAB)


@pytest.fixture
def runner(model):
    return HFModelRunner(model)


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


@torch.inference_mode()
def test_prompts_prefilled_together_get_the_logits_they_get_alone(model, runner):
    prompts = [prompt(n, seed) for seed, n in enumerate((5, 17, 11))]
    together = runner.prefill([PrefillChunk(i, ids, 0, i == 1) for i, ids in enumerate(prompts)])
    for i, ids in enumerate(prompts):
        expected = full_logits(model, ids)
        assert torch.allclose(together[i], expected if i == 1 else expected[-1:], atol=1e-5)


@torch.inference_mode()
def test_a_prompt_prefilled_in_chunks_gets_the_logits_of_one_pass(model, runner):
    ids = prompt(40, 3)
    pieces = [runner.prefill([PrefillChunk(7, ids[start : start + 16], start, True)])[0] for start in (0, 16, 32)]
    assert torch.allclose(torch.cat(pieces), full_logits(model, ids), atol=1e-5)


@torch.inference_mode()
def test_a_chunk_continues_a_prompt_begun_in_a_shared_padded_pass(model, runner):
    short, long = prompt(3, 4), prompt(30, 5)
    runner.prefill([PrefillChunk(1, short, 0, False), PrefillChunk(2, long[:10], 0, False)])
    [last] = runner.prefill([PrefillChunk(2, long[10:], 10, False)])
    assert torch.allclose(last, full_logits(model, long)[-1:], atol=1e-5)


@torch.inference_mode()
def test_joined_rows_decode_as_the_whole_sequence_would(model, runner):
    a, b = prompt(6, 6), prompt(13, 7)
    runner.prefill([PrefillChunk(1, a, 0, False), PrefillChunk(2, b, 0, False)])
    runner.join(1, 1)
    runner.join(2, 2)
    nxt = [9, 10, 11]
    logits = runner.decode(nxt)
    assert torch.allclose(logits[0], full_logits(model, a + [9])[-1], atol=1e-5)
    assert torch.allclose(logits[1], full_logits(model, b + [10])[-1], atol=1e-5)
    runner.keep([2, 0])  # row 1 leaves; the others swap places
    logits = runner.decode([12, 13])
    assert torch.allclose(logits[0], full_logits(model, b + [11, 12])[-1], atol=1e-5)
    assert torch.allclose(logits[1], full_logits(model, a + [9, 13])[-1], atol=1e-5)


@torch.inference_mode()
def test_a_chunk_that_does_not_follow_the_cache_is_refused(runner):
    runner.prefill([PrefillChunk(1, prompt(4, 8), 0, False)])
    with pytest.raises(ValueError):
        runner.prefill([PrefillChunk(1, prompt(4, 8), 9, False)])
    runner.release(1)
    with pytest.raises(ValueError):
        runner.prefill([PrefillChunk(1, prompt(4, 8), 4, False)])


@torch.inference_mode()
def test_warm_up_leaves_no_cache_behind(model, runner):
    runner.warm_up()
    with pytest.raises(ValueError):
        runner.decode([1])
    [logits] = runner.prefill([PrefillChunk(1, [5, 6], 0, False)])
    assert torch.allclose(logits, full_logits(model, [5, 6])[-1:], atol=1e-5)


def test_the_transformers_runner_is_chosen_on_request(model):
    assert isinstance(build_runner(model, "transformers"), HFModelRunner)
    with pytest.raises(ValueError):
        build_runner(model, "fastest")


def test_auto_falls_back_to_transformers_without_the_llama_runner(model, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "inference.llama", None)  # as if the module were absent
    assert isinstance(build_runner(model, "auto"), HFModelRunner)
    with pytest.raises(ValueError, match="llama"):
        build_runner(model, "llama")


def test_the_engine_warms_its_runner_up_before_it_reports_ready(monkeypatch):
    from inference.engine import Engine, EngineConfig
    from inference.model_loader import ModelConfig
    from testing.tiny_model import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    engine = Engine(ModelConfig(path="tiny", model_id="tiny", weights="float32"), EngineConfig(runner="transformers"))
    ready_during_warm_up = []
    monkeypatch.setattr(HFModelRunner, "warm_up", lambda self: ready_during_warm_up.append(engine.ready))
    engine.start(tiny_model(len(tokenizer)), tokenizer)
    try:
        assert engine.wait_ready(30)
    finally:
        engine.stop()
    assert ready_during_warm_up == [False]
