"""``best_of``: ``best_of`` candidates are generated server-side and the ``n`` best are returned.

"Best" is OpenAI's "highest log probability per token": the mean of the returned tokens'
log-probabilities.  Candidate ``j`` of a seeded request draws from ``seed + j`` whatever ``n`` is,
so the same request with ``n = best_of`` and ``logprobs`` shows every candidate and its mean, and
the ``best_of`` answer must be the top ``n`` of them, best first.  ``best_of < n`` and
``best_of`` with ``stream`` are 400s.
"""

from __future__ import annotations

import pytest

from tests.completion_helpers import NO_EOS, complete, mean

PROMPT = "Once upon a time"
SEEDED = {"prompt": PROMPT, "max_tokens": 5, "temperature": 1.0, "seed": 11, "logit_bias": NO_EOS}
BEST_OF, N = 4, 2


@pytest.fixture(scope="module")
def candidates(server) -> list[dict]:
    """Every candidate of the seeded request, with its logprobs."""
    return complete(server, **SEEDED, n=BEST_OF, logprobs=0)["choices"]


def _mean_logprob(choice: dict) -> float:
    return mean(choice["logprobs"]["token_logprobs"])


def _ranked(candidates: list[dict]) -> list[dict]:
    return sorted(candidates, key=_mean_logprob, reverse=True)


def test_the_candidates_differ(candidates):
    assert len({c["text"] for c in candidates}) > 1  # otherwise the ranking proves nothing


def test_best_of_returns_the_n_candidates_with_the_highest_mean_logprob_best_first(server, candidates):
    best = complete(server, **SEEDED, n=N, best_of=BEST_OF)
    assert [c["index"] for c in best["choices"]] == list(range(N))
    assert [c["text"] for c in best["choices"]] == [c["text"] for c in _ranked(candidates)[:N]]


def test_best_of_with_logprobs_returns_the_chosen_candidates_logprobs(server, candidates):
    best = complete(server, **SEEDED, n=1, best_of=BEST_OF, logprobs=0)
    (choice,) = best["choices"]
    winner = _ranked(candidates)[0]
    assert choice["text"] == winner["text"] and choice["logprobs"] == winner["logprobs"]
    assert _mean_logprob(choice) == max(_mean_logprob(c) for c in candidates)


def test_usage_counts_every_candidate_generated(server):
    best = complete(server, **SEEDED, n=1, best_of=3)
    assert best["usage"]["completion_tokens"] == 3 * SEEDED["max_tokens"]


def test_best_of_with_several_prompts_keeps_prompt_major_order(server, candidates):
    other = "The weather today is"
    best = complete(server, **{**SEEDED, "prompt": [PROMPT, other]}, n=N, best_of=BEST_OF)
    assert [c["index"] for c in best["choices"]] == list(range(2 * N))
    assert [c["text"] for c in best["choices"][:N]] == [c["text"] for c in _ranked(candidates)[:N]]


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"best_of": 1, "n": 2}, "integer_below_min_value", "best_of must be greater than or equal to n"),
        ({"best_of": 2, "stream": True}, "invalid_value", "best_of > 1 cannot be used with stream"),
    ],
    ids=["below_n", "with_stream"],
)
def test_best_of_below_n_or_with_stream_is_a_400_naming_best_of(server, fields, code, message):
    response = server.post({"model": "smollm2-135m-instruct", "prompt": PROMPT, **fields})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("best_of", code)
    assert "'best_of'" in error["message"] and message in error["message"]
