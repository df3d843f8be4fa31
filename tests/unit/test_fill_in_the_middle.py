"""suffix: fill-in-the-middle prompts for tokenizers with FIM tokens, a 400 for the others."""

from __future__ import annotations

from transformers import AddedToken

from testing.tiny_engine import start_tiny_engine
from testing.tiny_model import tiny_model, tiny_tokenizer


def test_fim_prompt_is_prefix_suffix_middle_in_psm_order():
    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(t, special=True) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
            ]
        }
    )
    from inference.engine import Engine, EngineConfig
    from inference.model_loader import ModelConfig

    engine = Engine(ModelConfig(path="tiny", model_id="tiny", weights="float32"), EngineConfig())
    engine.start(tiny_model(len(tokenizer)), tokenizer)
    assert engine.wait_ready(30)
    try:
        ids = engine.fim_prompt_ids("ab", "c")
        tokens = tokenizer.convert_ids_to_tokens(ids)
        assert tokens == ["<fim_prefix>", "a", "b", "<fim_suffix>", "c", "<fim_middle>"]
    finally:
        engine.stop()


def test_a_tokenizer_without_fim_tokens_has_no_fim_prompt():
    engine = start_tiny_engine()
    try:
        assert engine.fim_prompt_ids("ab", "c") is None
    finally:
        engine.stop()
