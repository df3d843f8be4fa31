"""A tiny random-weight Llama and a character-level tokenizer, built in the test: no files, no hub.

Unit tests of the engine run on it in float32, where a batch of rows computes each row exactly as
it would alone, so batching may be compared token for token.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ALPHABET = string.ascii_letters + string.digits + " .,!?'\n-"
EOS = "<eos>"


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of :data:`ALPHABET`, plus ``<eos>`` (id 0) and ``<unk>`` (id 1)."""
    vocab = {EOS: 0, "<unk>": 1, **{char: i + 2 for i, char in enumerate(ALPHABET)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, unk_token="<unk>")


def tiny_model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with hidden size 64 and random weights (``seed``), float32, eval mode."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=0,
        bos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    model = LlamaForCausalLM(config)
    return model.eval()
