"""``prompt``: a string, an array of strings, an array of token ids, or an array of token-id arrays.

A token-id prompt is the same prompt as the text it decodes to; an array of prompts answers
prompt-major (choice ``index = prompt_index * n + j``); an empty prompt generates from the start
of a document; token ids the vocabulary does not have are 400s naming ``prompt``, never 5xx.
"""

from __future__ import annotations

import pytest

from testing.live_server import MODEL
from tests.completion_helpers import NO_EOS, complete, served_tokenizer

PROMPT = "The capital of France is"
OTHER = "def fibonacci(n):"
GREEDY = {"max_tokens": 4, "temperature": 0, "logit_bias": NO_EOS}


@pytest.fixture(scope="module")
def tokenizer(server):
    return served_tokenizer(server)


@pytest.fixture(scope="module")
def as_text(server) -> dict:
    return complete(server, prompt=PROMPT, echo=True, logprobs=2, **GREEDY)


def _without_id(answer: dict) -> dict:
    return {name: value for name, value in answer.items() if name not in ("id", "created")}


@pytest.mark.parametrize("form", ["token_ids", "array_of_token_ids", "array_of_one_string"])
def test_every_form_of_the_same_prompt_gets_the_same_answer(server, tokenizer, as_text, form):
    ids = tokenizer.encode(PROMPT)
    prompt = {"token_ids": ids, "array_of_token_ids": [ids], "array_of_one_string": [PROMPT]}[form]
    answer = complete(server, prompt=prompt, echo=True, logprobs=2, **GREEDY)
    assert _without_id(answer) == _without_id(as_text)  # text, echo, logprobs, offsets and usage


def test_an_array_of_prompts_answers_prompt_major(server, tokenizer):
    """Choice ``p * n + j`` is candidate ``j`` of prompt ``p``, whatever form each prompt has."""
    seeded = {"max_tokens": 3, "temperature": 1.0, "seed": 5, "logit_bias": NO_EOS, "n": 2}
    alone = [complete(server, prompt=prompt, **seeded)["choices"] for prompt in (PROMPT, OTHER)]
    together = complete(server, prompt=[tokenizer.encode(PROMPT), tokenizer.encode(OTHER)], **seeded)
    assert [c["index"] for c in together["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in together["choices"]] == [c["text"] for choices in alone for c in choices]
    as_strings = complete(server, prompt=[PROMPT, OTHER], **seeded)
    assert [c["text"] for c in as_strings["choices"]] == [c["text"] for c in together["choices"]]


def test_usage_counts_the_tokens_of_every_prompt(server, tokenizer):
    answer = complete(server, prompt=[PROMPT, OTHER, PROMPT], max_tokens=1, logit_bias=NO_EOS)
    expected = 2 * len(tokenizer.encode(PROMPT)) + len(tokenizer.encode(OTHER))
    assert answer["usage"]["prompt_tokens"] == expected
    assert answer["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("prompt", ["", [""], None], ids=["empty_string", "array_of_empty_string", "null"])
def test_an_empty_prompt_generates_from_the_start_of_a_document(server, prompt):
    answer = complete(server, prompt=prompt, **GREEDY)
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "length" and choice["text"]
    assert answer["usage"]["prompt_tokens"] >= 1  # the document separator stands in for nothing


def test_the_empty_prompt_forms_agree(server):
    texts = {complete(server, prompt=prompt, **GREEDY)["choices"][0]["text"] for prompt in ("", None)}
    assert len(texts) == 1


@pytest.mark.parametrize(
    ("prompt", "param", "code"),
    [
        ([-1], "prompt[0]", "integer_below_min_value"),
        ([[5], [3, -7]], "prompt[1][1]", "integer_below_min_value"),
        ([10**12], "prompt[0]", "integer_above_max_value"),
        ([[1], [2**40]], "prompt[1][0]", "integer_above_max_value"),
        ([1.5], "prompt[0]", "invalid_type"),
        ([True], "prompt[0]", "invalid_type"),
        (["a", 1], "prompt[1]", "invalid_type"),
        ([], "prompt", "empty_array"),
        ([[]], "prompt[0]", "empty_array"),
        ([[1], []], "prompt[1]", "empty_array"),
    ],
    ids=[
        "negative",
        "negative_in_array",
        "beyond_vocabulary",
        "beyond_vocabulary_in_array",
        "fraction",
        "boolean",
        "mixed",
        "empty_array",
        "empty_token_array",
        "one_empty_token_array",
    ],
)
def test_a_token_id_the_vocabulary_lacks_is_a_400_naming_its_place_in_prompt(server, prompt, param, code):
    response = server.post({"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert f"'{param}'" in error["message"]


def test_a_negative_token_id_reads_like_openai(server):
    error = server.post({"model": MODEL, "prompt": [[5], [3, -7]], "max_tokens": 1}).json()["error"]
    assert (
        error["message"]
        == "Invalid 'prompt[1][1]': integer below minimum value. Expected a value >= 0, but got -7 instead."
    )


def test_the_largest_token_id_is_accepted_and_one_more_is_not(server, tokenizer):
    size = len(tokenizer)
    assert server.post({"model": MODEL, "prompt": [size - 1], "max_tokens": 1}).status_code == 200
    beyond = server.post({"model": MODEL, "prompt": [size], "max_tokens": 1})
    assert beyond.status_code == 400 and f"{size} tokens" in beyond.json()["error"]["message"]
