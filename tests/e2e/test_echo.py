"""``echo``: the prompt comes back before the completion, and with ``logprobs`` the prompt's tokens too.

The first prompt token has nothing before it, so its ``token_logprobs`` and ``top_logprobs`` entries
are null (as OpenAI sends them); the others are the model's log-probabilities of each next prompt
token.  ``text_offset`` counts from the start of the prompt: 0 for the first prompt token, the
prompt's length for the first completion token.  ``echo`` with ``max_tokens: 0`` is a scoring
request: the prompt and its log-probabilities, nothing generated.
"""

from __future__ import annotations

import pytest

from tests.completion_helpers import NO_EOS, complete, is_bytes_token

PROMPT = "The capital of France is"
CHAT_PROMPT = "<|im_start|>user\nHi<|im_end|>\n"  # special tokens written in the prompt's text
EMOJI_PROMPT = "Weather: ☀️🌧️ 雨"


@pytest.fixture(scope="module")
def echoed(server) -> dict:
    return complete(server, prompt=PROMPT, echo=True, logprobs=2, max_tokens=4, temperature=0, logit_bias=NO_EOS)


def _prompt_part(answer: dict) -> int:
    """How many of a choice's logprobs entries are the prompt's."""
    return answer["usage"]["prompt_tokens"]


def test_the_text_starts_with_the_prompt(server, echoed):
    assert echoed["choices"][0]["text"].startswith(PROMPT)
    plain = complete(server, prompt=PROMPT, max_tokens=4, temperature=0, logit_bias=NO_EOS)
    assert echoed["choices"][0]["text"] == PROMPT + plain["choices"][0]["text"]


def test_there_is_a_logprobs_entry_for_every_prompt_and_completion_token(echoed):
    logprobs = echoed["choices"][0]["logprobs"]
    usage = echoed["usage"]
    for values in logprobs.values():
        assert len(values) == usage["prompt_tokens"] + usage["completion_tokens"]


def test_only_the_first_prompt_token_has_null_logprobs(echoed):
    logprobs = echoed["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(isinstance(value, float) and value <= 0 for value in logprobs["token_logprobs"][1:])
    for token, value, top in zip(logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:]):
        assert top[token] == value and len(top) <= 3


def test_the_echoed_tokens_spell_the_prompt_then_the_completion(echoed):
    choice = echoed["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert "".join(tokens) == choice["text"]
    assert "".join(tokens[: _prompt_part(echoed)]) == PROMPT


def test_text_offsets_start_at_zero_and_the_completion_starts_at_the_prompts_length(echoed):
    logprobs = echoed["choices"][0]["logprobs"]
    offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
    assert offsets[0] == 0
    assert offsets[_prompt_part(echoed)] == len(PROMPT)
    assert all(offsets[k + 1] == offsets[k] + len(tokens[k]) for k in range(len(tokens) - 1))


@pytest.mark.parametrize("prompt", [CHAT_PROMPT, EMOJI_PROMPT], ids=["special_tokens", "split_characters"])
def test_every_echoed_token_sits_at_its_text_offset(server, prompt):
    choice = complete(server, prompt=prompt, echo=True, logprobs=0, max_tokens=3, temperature=0, logit_bias=NO_EOS)[
        "choices"
    ][0]
    text, tokens, offsets = choice["text"], choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]
    assert text.startswith(prompt)
    assert offsets == sorted(offsets) and offsets[0] == 0
    for token, offset in zip(tokens, offsets):
        if not is_bytes_token(token):
            assert text[offset : offset + len(token)] == token, (token, offset, text)
    assert len(prompt) in offsets  # where the completion starts


def test_a_prompt_character_split_over_tokens_is_echoed_as_bytes_tokens(server):
    choice = complete(server, prompt=EMOJI_PROMPT, echo=True, logprobs=1, max_tokens=0)["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert any(is_bytes_token(token) for token in tokens), tokens
    assert all(is_bytes_token(token) or "\ufffd" not in token for token in tokens)


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(server, echoed):
    scored = complete(server, prompt=PROMPT, echo=True, logprobs=2, max_tokens=0)
    choice = scored["choices"][0]
    assert choice["text"] == PROMPT
    assert choice["finish_reason"] == "length"
    assert scored["usage"]["completion_tokens"] == 0
    assert scored["usage"]["prompt_tokens"] == echoed["usage"]["prompt_tokens"]
    prompt_part = _prompt_part(echoed)
    expected = {name: values[:prompt_part] for name, values in echoed["choices"][0]["logprobs"].items()}
    assert choice["logprobs"] == expected  # the same scores as when the prompt is echoed before a completion


def test_echoed_logprobs_are_the_models_probabilities_of_each_next_token(server, echoed):
    """Scoring prompt + completion gives the completion's tokens the log-probabilities they were generated
    with (up to the numerical noise of a prefill against one-token decode steps)."""
    generated = echoed["choices"][0]
    completion = generated["text"][len(PROMPT) :]
    scored = complete(server, prompt=PROMPT + completion, echo=True, logprobs=2, max_tokens=0)["choices"][0]
    # Re-tokenising the text may merge generated tokens differently; compare up to the first such place.
    same = 0
    for mine, theirs in zip(scored["logprobs"]["tokens"], generated["logprobs"]["tokens"]):
        if mine != theirs:
            break
        same += 1
    assert same > _prompt_part(echoed)
    for k in range(1, same):
        expected = generated["logprobs"]["token_logprobs"][k]
        assert scored["logprobs"]["token_logprobs"][k] == pytest.approx(expected, abs=0.5)


def test_echo_of_an_empty_prompt_is_just_the_completion(server):
    answer = complete(server, prompt="", echo=True, logprobs=0, max_tokens=2, temperature=0, logit_bias=NO_EOS)
    choice = answer["choices"][0]
    usage = answer["usage"]
    assert len(choice["logprobs"]["tokens"]) == usage["prompt_tokens"] + usage["completion_tokens"]
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert choice["logprobs"]["text_offset"][0] == 0
    plain = complete(server, prompt="", max_tokens=2, temperature=0, logit_bias=NO_EOS)
    assert choice["text"] == plain["choices"][0]["text"]


def test_echo_without_logprobs_returns_the_prompt_and_no_logprobs(server):
    choice = complete(server, prompt=PROMPT, echo=True, max_tokens=1, temperature=0)["choices"][0]
    assert choice["text"].startswith(PROMPT) and choice["logprobs"] is None
