"""A SentencePiece vocabulary read from a GGUF file (Mistral's and Phi-3's, through transformers'
Llama tokenizer, whose decoder strips a text's first space): each token's ``logprobs`` text keeps
its word's leading space, so the tokens spell the text; a byte-fallback token's bytes are its byte;
an echoed prompt's offsets after the BOS point at its words."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from api.chat.protocol import token_logprob
from inference.formats import ggml
from inference.model_loader import gguf_tokenizer
from inference.outputs import TokenLogprob
from inference.text import IncrementalDetokenizer, prompt_text_offsets, token_bytes, token_text
from testing import tiny_families

TOKENS = tiny_families.SENTENCEPIECE_TOKENS


@pytest.fixture(scope="module", params=[("mistral", "llama"), ("phi3", "phi3")], ids=["mistral", "phi3"])
def tokenizer(request, tmp_path_factory):
    """The tokenizer a server reads from a tiny GGUF file of the family with a SentencePiece vocabulary."""
    name, architecture = request.param
    folder = tmp_path_factory.mktemp(name)
    model = tiny_families.tiny_family_model(name, vocab_size=len(TOKENS))
    path = folder / "tiny.gguf"
    tiny_families.write_gguf(model, path, ggml.F32, architecture=architecture, tokenizer="sentencepiece")
    return gguf_tokenizer(path, folder / "cache")


def test_a_generated_words_token_keeps_its_leading_space(tokenizer):
    prompt = tokenizer.encode("Hello")
    generated = [TOKENS.index("\u2581world")] * 2
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    text = "".join(detokenizer.add(token) for token in generated)

    assert text == " world world"
    assert [token_text(tokenizer, token) for token in generated] == [" world", " world"]


@pytest.mark.parametrize(
    "piece, text, raw",
    [
        ("<0xC3>", "bytes:\\xc3", b"\xc3"),
        ("<0x41>", "A", b"A"),
        ("\u00e9", "\u00e9", "\u00e9".encode()),
        ("H", "H", b"H"),
    ],
)
def test_a_tokens_bytes_are_what_it_writes(tokenizer, piece, text, raw):
    token = TOKENS.index(piece)

    assert token_bytes(tokenizer, token) == raw
    assert token_text(tokenizer, token) == text


def test_chat_logprobs_give_a_tokens_text_and_bytes(tokenizer):
    world, byte = TOKENS.index("\u2581world"), TOKENS.index("<0xC3>")
    entry = token_logprob(tokenizer, TokenLogprob(world, -0.5, [(world, -0.5), (byte, -1.0)]))

    assert (entry["token"], entry["bytes"]) == (" world", list(b" world"))
    assert entry["top_logprobs"][1]["token"] == "bytes:\\xc3" and entry["top_logprobs"][1]["bytes"] == [0xC3]


def test_an_echoed_prompts_offsets_after_its_bos_point_at_its_words(tokenizer):
    text = "Hello world"
    ids = tokenizer.encode(text)
    assert tokenizer.convert_ids_to_tokens(ids) == ["<s>", "\u2581Hello", "\u2581world"]

    assert prompt_text_offsets(tokenizer, ids, text) == [0, 0, 5]


def test_echoed_offsets_after_a_special_token_in_the_prompt_stay_on_its_words(tokenizer):
    # Phi-3's tokenizer adds a word space after a special token that the text does not hold.
    text = "Hello</s> world world"

    offsets = prompt_text_offsets(tokenizer, tokenizer.encode(text), text)

    assert offsets[-1] == text.rindex(" world") and all(b <= len(text) for b in offsets)


def test_special_tokens_read_as_their_text(tokenizer):
    assert token_text(tokenizer, TOKENS.index("</s>")) == "</s>"
