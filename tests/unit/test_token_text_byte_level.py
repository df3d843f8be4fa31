"""``logprobs`` token texts of vocabularies other than SentencePiece read as their decoder writes
them, as they did before SentencePiece tokens got their own reading: the embedded model's byte-level
BPE (its U+FFFD token included, and with a decoder that cleans up spaces) and a BPE with a suffix."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from inference.text import IncrementalDetokenizer, token_text

REPLACEMENT_CHARACTER = 24211  # the embedded vocabulary's token for U+FFFD's three bytes


@cache
def embedded_tokenizer() -> PreTrainedTokenizerFast:
    from django.conf import settings

    from inference.model_loader import embedded_gguf_path, gguf_tokenizer

    return gguf_tokenizer(embedded_gguf_path(), Path(settings.MODEL_CACHE_DIR))


def test_the_byte_level_replacement_character_token_is_still_written_as_bytes():
    tokenizer = embedded_tokenizer()

    assert tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(REPLACEMENT_CHARACTER)]) == "\ufffd"
    assert token_text(tokenizer, REPLACEMENT_CHARACTER) == "bytes:\\xef\\xbf\\xbd"


@pytest.mark.parametrize("text", ["Hello , world .", "Wait !"])
def test_byte_level_tokens_spell_the_text_a_cleaning_decoder_writes(text, tmp_path):
    embedded_tokenizer().save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(
        tmp_path,
        clean_up_tokenization_spaces=True,
        clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=True,
    )
    ids = tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(tokenizer, ids[:1])
    pieces = [detokenizer.add(token) for token in ids[1:]]

    assert [token_text(tokenizer, token) for token in ids[1:]] == pieces


def test_a_suffix_bpe_token_reads_as_its_decoder_writes_it():
    vocab = {"hello</w>": 0, "world</w>": 1}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], end_of_word_suffix="</w>"))
    backend.decoder = decoders.BPEDecoder(suffix="</w>")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)

    assert token_text(tokenizer, 0) == tokenizer.decode([0]) == "hello"


def test_a_tokenizer_let_go_is_not_kept_by_the_vocabulary_cache():
    import gc
    import weakref

    backend = Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    token_text(tokenizer, 0)
    gone = weakref.ref(tokenizer)
    del tokenizer
    gc.collect()

    assert gone() is None
