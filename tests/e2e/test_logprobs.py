"""``logprobs``: four parallel lists per choice, whose invariants hold for any model.

One entry per returned token in ``tokens``, ``token_logprobs``, ``top_logprobs`` and ``text_offset``;
the tokens spell the text; ``top_logprobs`` holds at most ``logprobs + 1`` entries and always the
sampled token; ``text_offset`` counts characters from the start of the prompt (so the completion's
first token sits at ``len(prompt)``); a token that is not whole UTF-8 is written ``bytes:\\xNN``.
The log-probabilities are those of the distribution the token was drawn from: after temperature
(and ``logit_bias`` and penalties, see ``test_penalties_and_bias.py``), before top-p truncation.
"""

from __future__ import annotations

import math

import pytest

from tests.completion_helpers import NO_EOS, complete, is_bytes_token, token_bytes

PROMPT = "The capital of France is"
NON_LATIN_PROMPT = "Reply with only emojis: 😀😃😄 and Chinese: 你好，世界。"


@pytest.fixture(scope="module")
def greedy(server) -> dict:
    return complete(server, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3, logit_bias=NO_EOS)


@pytest.fixture(scope="module")
def sampled(server) -> dict:
    """Sampled at a high temperature with the most alternatives, so some tokens are outside the top."""
    return complete(server, prompt=PROMPT, max_tokens=6, temperature=2, seed=7, logprobs=5, logit_bias=NO_EOS)


@pytest.fixture(scope="module")
def non_latin(server) -> dict:
    return complete(server, prompt=NON_LATIN_PROMPT, max_tokens=12, temperature=0, logprobs=1, logit_bias=NO_EOS)


ASKED = {"greedy": (PROMPT, 3), "sampled": (PROMPT, 5), "non_latin": (NON_LATIN_PROMPT, 1)}


@pytest.fixture(params=list(ASKED))
def case(request) -> tuple[dict, str, int]:
    """(the answer, its prompt, the ``logprobs`` it asked for)."""
    return (request.getfixturevalue(request.param), *ASKED[request.param])


def test_the_four_lists_have_one_entry_per_returned_token(case):
    answer, _, _ = case
    logprobs = answer["choices"][0]["logprobs"]
    lengths = {name: len(values) for name, values in logprobs.items()}
    assert set(lengths.values()) == {answer["usage"]["completion_tokens"]}, lengths


def test_the_tokens_spell_the_text(case):
    choice = case[0]["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    if not any(is_bytes_token(token) for token in tokens):
        assert "".join(tokens) == choice["text"]
    # With bytes: tokens the bytes spell the text, but for the end of a character cut off by max_tokens.
    spelled = b"".join(token_bytes(token) for token in tokens)
    text = choice["text"].encode("utf-8")
    assert spelled.startswith(text)
    rest = spelled[len(text) :]
    assert len(rest) < 4 and all(byte >= 0x80 for byte in rest)


def test_top_logprobs_has_at_most_logprobs_plus_one_entries_and_always_the_sampled_token(case):
    answer, _, asked = case
    logprobs = answer["choices"][0]["logprobs"]
    for token, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert 1 <= len(top) <= asked + 1
        assert top[token] == value
        assert all(v <= 0 for v in top.values())
        if len(top) == asked + 1:  # the sampled token came on top of the best ``asked``: it is the least likely
            assert value == min(top.values())


def test_greedy_tokens_are_the_most_likely_ones(greedy):
    logprobs = greedy["choices"][0]["logprobs"]
    for value, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert value == max(top.values())


def test_a_high_temperature_sample_leaves_the_top_sometimes(sampled):
    logprobs = sampled["choices"][0]["logprobs"]
    assert any(len(top) == 6 for top in logprobs["top_logprobs"]) or any(
        value < max(top.values()) for value, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"])
    )


def test_text_offset_starts_at_the_prompt_length_and_grows_by_each_tokens_length(case):
    answer, prompt, _ = case
    choice = answer["choices"][0]
    text, offsets, tokens = choice["text"], choice["logprobs"]["text_offset"], choice["logprobs"]["tokens"]
    assert offsets[0] == len(prompt)  # characters, not bytes or tokens
    for k, token in enumerate(tokens):
        if is_bytes_token(token):
            continue
        start = offsets[k] - len(prompt)
        assert text[start : start + len(token)] == token
        if k + 1 < len(tokens):
            assert offsets[k + 1] == offsets[k] + len(token)
    assert offsets == sorted(offsets)
    assert offsets[-1] <= len(prompt) + len(text)


def test_a_token_that_is_not_whole_utf8_is_written_as_bytes(non_latin):
    tokens = non_latin["choices"][0]["logprobs"]["tokens"]
    partial = [token for token in tokens if token.startswith("bytes:")]
    assert partial, f"the prompt did not make the model write split characters: {tokens}"
    assert all(is_bytes_token(token) for token in partial)
    assert "\ufffd" not in "".join(tokens) + non_latin["choices"][0]["text"]


def test_logprobs_zero_gives_only_the_sampled_token(server):
    logprobs = complete(server, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=0)["choices"][0]["logprobs"]
    assert [list(top) for top in logprobs["top_logprobs"]] == [[token] for token in logprobs["tokens"]]


def test_logprobs_are_taken_after_temperature_and_before_top_p(server):
    """At temperature T log-probability differences are those at 1 divided by T; top-p changes none."""
    unscaled = complete(server, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=5)["choices"][0]["logprobs"]
    # top_p=0 keeps only the most likely token: the draw is the greedy token, whatever the seed.
    scaled = complete(server, prompt=PROMPT, max_tokens=1, temperature=0.5, top_p=0, seed=1, logprobs=5)["choices"][0][
        "logprobs"
    ]
    assert scaled["tokens"] == unscaled["tokens"]
    before, after = unscaled["top_logprobs"][0], scaled["top_logprobs"][0]
    assert list(after) == list(before)  # the same five tokens, in the same order
    best = unscaled["tokens"][0]
    for token in before:
        assert after[token] - after[best] == pytest.approx((before[token] - before[best]) / 0.5, abs=1e-3)
    # Before truncation: the greedy token did not get all the probability mass top-p left it.
    assert scaled["token_logprobs"][0] == after[best] < -1e-4
    assert math.fsum(math.exp(v) for v in after.values()) < 1
