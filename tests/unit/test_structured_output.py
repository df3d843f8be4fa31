"""Grammar-constrained decoding (inference/structured.py) on the embedded model's real tokenizer.

No model runs here: random logits stand in for it, so whatever the mask lets through is what a
model could pick.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import torch

from inference.structured import GrammarError, apply_bitmask, compile_json_grammar

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@cache
def tokenizer_and_vocab():
    from django.conf import settings
    from transformers import AutoTokenizer

    from inference.model_loader import converted_gguf_dir, embedded_gguf_path

    folder = converted_gguf_dir(embedded_gguf_path(), Path(settings.MODEL_CACHE_DIR))
    return AutoTokenizer.from_pretrained(folder), 49152  # SmolLM2's output width


def grammar(schema):
    tokenizer, vocab = tokenizer_and_vocab()
    return compile_json_grammar(tokenizer, vocab, schema)


def decode_randomly(schema, seed: int, steps: int = 300) -> tuple[str, bool]:
    """Pick the best of random logits under the mask until the grammar completes."""
    tokenizer, vocab = tokenizer_and_vocab()
    matcher = grammar(schema).matcher()
    generator = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(steps):
        logits = torch.randn(vocab, generator=generator)
        matcher.mask_logits(logits)
        token = int(logits.argmax())
        ids.append(token)
        if matcher.accept(token):
            return tokenizer.decode(ids), True
    return tokenizer.decode(ids), False


@pytest.mark.parametrize("seed", range(5))
def test_any_token_the_mask_allows_keeps_the_output_valid_against_the_schema(seed):
    text, complete = decode_randomly(SCHEMA, seed)

    assert complete, text
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("seed", range(3))
def test_json_object_mode_yields_a_json_object(seed):
    text, complete = decode_randomly(None, seed, steps=2000)

    if complete:  # random logits may keep an object open for long; whatever completed is an object
        assert isinstance(json.loads(text), dict)
    else:
        assert text.lstrip().startswith("{")


def test_a_complete_value_leaves_only_the_end_of_sequence_token():
    tokenizer, vocab = tokenizer_and_vocab()
    matcher = grammar({"type": "boolean"}).matcher()
    logits = torch.zeros(vocab)
    *head, last = tokenizer.encode("true", add_special_tokens=False)

    assert not any(matcher.accept(token) for token in head)
    assert matcher.accept(last)
    matcher.mask_logits(logits)

    assert torch.isfinite(logits).nonzero().flatten().tolist() == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_matchers_of_one_grammar_do_not_share_state():
    tokenizer, vocab = tokenizer_and_vocab()
    compiled = grammar(SCHEMA)
    first, second = compiled.matcher(), compiled.matcher()
    for token in tokenizer.encode('{"name": "x', add_special_tokens=False):
        first.accept(token)
    fresh, untouched = torch.zeros(vocab), torch.zeros(vocab)

    second.mask_logits(untouched)
    compiled.matcher().mask_logits(fresh)

    assert torch.equal(torch.isfinite(untouched), torch.isfinite(fresh))


def test_a_schema_is_compiled_once():
    assert grammar(SCHEMA) is grammar(json.loads(json.dumps(SCHEMA)))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "(?<=a)b"},  # look-behind: not a regular language
        {"type": 12},
    ],
)
def test_a_schema_the_library_cannot_compile_is_a_grammar_error(schema):
    with pytest.raises(GrammarError):
        grammar(schema)


@pytest.mark.parametrize("vocab", [31, 32, 100, 49152])
@pytest.mark.parametrize("contiguous", [True, False], ids=["numpy", "torch"])
def test_apply_bitmask_forbids_exactly_the_tokens_whose_bit_is_clear(vocab, contiguous):
    generator = torch.Generator().manual_seed(vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, ((vocab + 31) // 32,), dtype=torch.int32, generator=generator)
    bitmask[0] = -2  # every bit set but token 0's, the sign bit (token 31) too
    storage = torch.randn(vocab, 2, generator=generator)
    logits = storage[:, 0].contiguous() if contiguous else storage[:, 0]  # a strided view takes torch's path
    before = logits.clone()
    apply_bitmask(logits, bitmask)
    words = bitmask.tolist()
    allowed = torch.tensor([(words[i // 32] >> (i % 32)) & 1 == 1 for i in range(vocab)])
    assert torch.equal(logits[allowed], before[allowed])
    assert torch.isneginf(logits[~allowed]).all()
    assert allowed[1 : min(vocab, 32)].all() and not allowed[0]
