"""The output processor alone: token ids in, released text, stop strings, finish reasons and logprobs out."""

from __future__ import annotations

import asyncio

import pytest
import torch

from inference import cpu_kernels
from inference.output_processor import OutputProcessor
from inference.sampling import SamplingParams
from inference.sequence import Request
from testing.tiny_model import tiny_tokenizer

EOS_ID = 0


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def processor(tokenizer):
    return OutputProcessor(tokenizer, {EOS_ID}, len(tokenizer), max_context=64, device=torch.device("cpu"))


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def request(tokenizer, loop, prompt="ab", **params) -> Request:
    return Request("r", tokenizer.encode(prompt), SamplingParams(**params), loop, torch.device("cpu"))


def feed(processor, tokenizer, seq, text):
    """Append ``text``'s tokens one by one; return every step's released text (None: nothing released)."""
    released = []
    for token_id in tokenizer.encode(text):
        processor.append(seq, token_id, None)
        output = processor.release(seq)
        released.append(None if output is None else output.text)
        if seq.finished:
            break
    return released


def test_text_that_could_still_become_a_stop_string_is_held_back(processor, tokenizer, loop):
    seq = processor.new_sequences(request(tokenizer, loop, max_tokens=20, stop=("xyz",)))[0]
    assert feed(processor, tokenizer, seq, "abx") == ["a", "b", None]
    assert feed(processor, tokenizer, seq, "yq") == [None, "xyq"]  # "xyq" is no stop string after all


def test_the_stop_string_is_never_released_and_finishes_with_stop(processor, tokenizer, loop):
    seq = processor.new_sequences(request(tokenizer, loop, max_tokens=20, stop=("lo",)))[0]
    released = feed(processor, tokenizer, seq, "hello world")
    assert "".join(text for text in released if text) == "hel"
    assert seq.finish_reason == "stop"


def test_the_end_of_sequence_token_finishes_without_text(processor, tokenizer, loop):
    seq = processor.new_sequences(request(tokenizer, loop, max_tokens=20))[0]
    feed(processor, tokenizer, seq, "ok")
    processor.append(seq, EOS_ID, None)
    output = processor.release(seq)
    assert (output.text, output.finish_reason, output.num_tokens) == ("", "stop", 2)


def test_ignore_eos_keeps_the_end_of_sequence_token_as_text(processor, tokenizer, loop):
    seq = processor.new_sequences(request(tokenizer, loop, max_tokens=20, ignore_eos=True))[0]
    processor.append(seq, EOS_ID, None)
    assert not seq.finished and seq.token_ids == [EOS_ID]


def test_max_tokens_finishes_with_length(processor, tokenizer, loop):
    seq = processor.new_sequences(request(tokenizer, loop, max_tokens=3))[0]
    assert feed(processor, tokenizer, seq, "abcdef") == ["a", "b", "c"]
    assert seq.finish_reason == "length"


def test_the_context_limit_finishes_with_length(processor, tokenizer, loop):
    seq = processor.new_sequences(request(tokenizer, loop, max_tokens=100))[0]
    seq.length = processor.max_context - 1
    processor.append(seq, tokenizer.encode("a")[0], None)
    assert seq.finish_reason == "length"


def test_a_scoring_request_finishes_at_once_without_tokens(processor, tokenizer, loop):
    scoring = request(tokenizer, loop, max_tokens=0, n=2, best_of=2, logprobs=0, prompt_logprobs=True)
    sequences = processor.new_sequences(scoring)
    assert [seq.finish_reason for seq in sequences] == ["length", "length"]
    [(req, output)] = processor.outputs(sequences)
    assert req is scoring and output.finished and [o.num_tokens for o in output.outputs] == [0, 0]


@pytest.mark.parametrize("logprobs", [0, 1, 2])  # 0 and 1 on our kernel where it loads
def test_prompt_logprobs_are_the_raw_log_softmax_and_go_out_once(processor, tokenizer, loop, logprobs):
    cpu_kernels.load(None)
    scoring = request(tokenizer, loop, prompt="abc", max_tokens=1, logprobs=logprobs, prompt_logprobs=True)
    ids = scoring.prompt_ids
    logits = torch.randn(len(ids), len(tokenizer), generator=torch.Generator().manual_seed(0))
    processor.add_prompt_logprobs(scoring, logits, ids[1:])
    expected = torch.log_softmax(logits, -1)
    entries = scoring.prompt_logprobs
    assert [entry.token_id for entry in entries] == ids and entries[0].logprob is None
    for row, entry in enumerate(entries[1:]):
        assert entry.logprob == pytest.approx(float(expected[row, ids[row + 1]]), rel=1e-5)
        top = expected[row].topk(logprobs) if logprobs else None
        assert [token for token, _ in entry.top] == (top.indices.tolist() if top else [])
        assert [value for _, value in entry.top] == pytest.approx(top.values.tolist() if top else [], rel=1e-5)
    sequences = processor.new_sequences(scoring)
    processor.append(sequences[0], ids[0], None)
    [(_, first)] = processor.outputs(sequences)
    assert first.prompt_logprobs == entries
    assert scoring.prompt_logprobs is None  # published once: later outputs carry none


def test_prompt_logprobs_of_logits_off_the_cpu_keep_torchs_path(processor, tokenizer, loop, monkeypatch):
    """Our kernel reads host memory: logits on another device (a GPU's; meta here) go to torch's
    log_softmax, never to it, whose read of a device pointer would crash the process."""

    class Kernels:
        def prompt_logprobs(self, logits, targets):
            raise AssertionError(f"the CPU kernel was given logits on {logits.device}")

    monkeypatch.setattr(cpu_kernels, "loaded", lambda: Kernels())
    scoring = request(tokenizer, loop, prompt="abc", max_tokens=1, logprobs=1, prompt_logprobs=True)
    ids = scoring.prompt_ids
    logits = torch.zeros(len(ids), len(tokenizer), device="meta")
    with pytest.raises(NotImplementedError, match="meta tensor"):  # torch's path, up to its copy out of meta
        processor.add_prompt_logprobs(scoring, logits, ids[1:])
