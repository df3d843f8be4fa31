"""A model's ``context_length`` (``EngineConfig.max_context``) caps the positions the engine serves."""

from __future__ import annotations

import pytest

from testing.tiny_engine import run_one, start_tiny_engine


@pytest.fixture(scope="module")
def capped():
    engine = start_tiny_engine(max_context=24)
    yield engine
    engine.stop()


def test_the_engine_serves_at_most_the_configured_context(capped):
    assert capped.max_context == 24  # the tiny model's own is 256


def test_a_generation_ends_with_length_at_the_capped_context(capped):
    prompt = "Hello there"
    result = run_one(capped, prompt, max_tokens=100, temperature=0, ignore_eos=True)

    assert result.finish_reason == "length"
    assert len(capped.encode(prompt)) + result.num_tokens == capped.max_context


def test_without_a_cap_the_model_keeps_its_own_context():
    engine = start_tiny_engine()
    try:
        assert engine.max_context == 256
    finally:
        engine.stop()
