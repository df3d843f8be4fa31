"""``logit_bias``, ``presence_penalty`` and ``frequency_penalty``, as OpenAI defines them.

``logit_bias`` adds to the logits: +100 forces a token, -100 bans it.  The penalties lower the
logit of each token ``j`` by ``c[j] * frequency_penalty + (c[j] > 0) * presence_penalty``, where
``c[j]`` counts ``j`` among the tokens generated so far (not the prompt's).  The returned
log-probabilities are of the distribution after all three, so the formula itself can be read back
from ``top_logprobs``: forcing one token with +100 makes every step's context the same with and
without penalties, and only that token's logit moves.
"""

from __future__ import annotations

import pytest

from tests.completion_helpers import NO_EOS, complete, served_tokenizer

PROMPT = "The capital of France is"
FORCED = 17  # any token id; its text is read from the answer
STEPS = 4


@pytest.fixture(scope="module")
def forced(server) -> dict:
    """``FORCED`` at +100 after a prompt made of that token: no penalty."""
    return complete(
        server,
        prompt=[FORCED] * 6,
        max_tokens=STEPS,
        temperature=0,
        logprobs=5,
        logit_bias={**NO_EOS, str(FORCED): 100},
    )["choices"][0]


def test_a_plus_100_bias_forces_the_token_every_step(forced):
    tokens = forced["logprobs"]["tokens"]
    assert len(set(tokens)) == 1 and forced["text"] == tokens[0] * STEPS
    assert all(value == pytest.approx(0, abs=1e-3) for value in forced["logprobs"]["token_logprobs"])


def test_a_minus_100_bias_bans_the_token(server):
    greedy = complete(server, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=5)["choices"][0]["logprobs"]
    favourite = greedy["tokens"][0]
    (banned,) = served_tokenizer(server).encode(favourite, add_special_tokens=False)
    again = complete(
        server, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=5, logit_bias={**NO_EOS, str(banned): -100}
    )["choices"][0]["logprobs"]
    assert favourite not in again["tokens"]
    assert all(favourite not in top for top in again["top_logprobs"])  # ~100 nats below the others


@pytest.mark.parametrize(("frequency", "presence"), [(1.5, 0.0), (0.0, 1.5), (0.75, -0.5), (-1.0, 2.0)])
def test_penalties_lower_a_generated_tokens_logit_by_count_times_frequency_plus_presence(
    server, forced, frequency, presence
):
    penalised = complete(
        server,
        prompt=[FORCED] * 6,
        max_tokens=STEPS,
        temperature=0,
        logprobs=5,
        frequency_penalty=frequency,
        presence_penalty=presence,
        logit_bias={**NO_EOS, str(FORCED): 100},
    )["choices"][0]
    token = forced["logprobs"]["tokens"][0]
    assert penalised["logprobs"]["tokens"] == forced["logprobs"]["tokens"]
    for step in range(STEPS):
        before, after = forced["logprobs"]["top_logprobs"][step], penalised["logprobs"]["top_logprobs"][step]
        others = [other for other in before if other != token and other in after]
        assert others
        # step tokens generated so far, all of them FORCED; the prompt's six count for nothing.
        expected = step * frequency + (step > 0) * presence
        for other in others:
            shift = (before[token] - before[other]) - (after[token] - after[other])
            assert shift == pytest.approx(expected, abs=2e-3), (step, other)
            # Tokens never generated keep their logits: their differences do not move.
            for third in others:
                assert after[other] - after[third] == pytest.approx(before[other] - before[third], abs=2e-3)


REPETITIVE = {
    "prompt": "apple apple apple apple apple apple apple",
    "max_tokens": 10,
    "temperature": 0,
    "logprobs": 0,
    "logit_bias": NO_EOS,
}


def _repeats(answer: dict) -> int:
    tokens = answer["choices"][0]["logprobs"]["tokens"]
    return len(tokens) - len(set(tokens))


@pytest.fixture(scope="module")
def unpenalised_repeats(server) -> int:
    return _repeats(complete(server, **REPETITIVE))


@pytest.mark.parametrize("penalty", ["frequency_penalty", "presence_penalty"])
def test_a_penalty_of_2_reduces_repetition_on_a_repetitive_greedy_prompt(server, unpenalised_repeats, penalty):
    assert _repeats(complete(server, **REPETITIVE, **{penalty: 2.0})) < unpenalised_repeats


@pytest.mark.parametrize(
    ("logit_bias", "param", "code", "message"),
    [
        (
            {"1": 101},
            "logit_bias.1",
            "integer_above_max_value",
            "Invalid 'logit_bias.1': integer above maximum value. Expected a value <= 100, but got 101 instead.",
        ),
        (
            {"1": -101},
            "logit_bias.1",
            "integer_below_min_value",
            "Invalid 'logit_bias.1': integer below minimum value. Expected a value >= -100, but got -101 instead.",
        ),
        ({"-1": 1}, "logit_bias", "invalid_value", None),
        ({"one": 1}, "logit_bias", "invalid_value", None),
        ({"1": 1.5}, "logit_bias.1", "invalid_type", None),
        ({"1": "1"}, "logit_bias.1", "invalid_type", None),
        ({"999999999": 1}, "logit_bias", "invalid_value", None),
    ],
    ids=["above_100", "below_minus_100", "negative_id", "not_an_id", "fraction", "string_value", "beyond_vocabulary"],
)
def test_a_bad_logit_bias_is_a_400_naming_logit_bias(server, logit_bias, param, code, message):
    response = server.post({"model": "smollm2-135m-instruct", "prompt": PROMPT, "logit_bias": logit_bias})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    if message is not None:
        assert error["message"] == message


@pytest.mark.parametrize(("name", "value"), [("frequency_penalty", 2.01), ("presence_penalty", -2.01)])
def test_a_penalty_outside_minus_2_to_2_is_a_400_naming_it(server, name, value):
    response = server.post({"model": "smollm2-135m-instruct", "prompt": PROMPT, name: value})
    assert response.status_code == 400 and response.json()["error"]["param"] == name
