"""Every answer of the live server conforms to OpenAI's spec, field by field, over a matrix of requests.

The requests go through raw HTTP and through the official ``openai`` client.  Each body is validated
with jsonschema against the vendored spec (``api/openai_schema.json``): responses against
``CreateCompletionResponse``, stream chunks against it too, errors against ``ErrorResponse``, and
``/v1/models`` against ``ListModelsResponse`` and ``Model``.  The schemas are *closed* here
(``additionalProperties: false`` on every object the spec lists properties for), so a key the spec
does not know fails too.

Relaxed copies, for the places where OpenAI's real API departs from its own spec (and so do we):

- ``finish_reason: null`` on a stream chunk that is not its choice's last (the spec's enum lacks null);
- ``usage: null`` on every chunk but the last with ``stream_options.include_usage``;
- a ``null`` first entry of ``token_logprobs`` and ``top_logprobs`` with ``echo`` (the first prompt
  token has nothing before it);
- our extension ``runner`` on a ``Model`` (which runner serves it and why, docs/models.md), itself closed.

Each relaxation is used only where it applies, and the tests pin down that the nulls appear exactly
there and nowhere else.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

import httpx
import openai
import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from api.protocol import SCHEMA_PATH
from testing.live_server import MODEL
from tests.completion_helpers import NO_EOS, complete, merge_stream, stream_events

PROMPT = "The capital of France is"
OTHER = "Once upon a time"

# --- The spec's schemas, closed, and their relaxed copies -------------------------------------------


@cache
def _document() -> dict[str, Any]:
    document = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    _close(document["$defs"])
    return document


def _close(node: Any) -> None:
    """``additionalProperties: false`` on every object schema that lists its properties."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close(value)
    elif isinstance(node, list):
        for value in node:
            _close(value)


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _relax_echo(document: dict[str, Any]) -> None:
    """``token_logprobs`` and ``top_logprobs`` entries may be null (the first echoed prompt token)."""
    choice = document["$defs"]["CreateCompletionResponse"]["properties"]["choices"]["items"]
    logprobs = choice["properties"]["logprobs"]["anyOf"][0]["properties"]
    for name in ("token_logprobs", "top_logprobs"):
        logprobs[name]["items"] = _nullable(logprobs[name]["items"])


def _relax_stream(document: dict[str, Any]) -> None:
    """A chunk's ``finish_reason`` may be null mid-stream, and its ``usage`` null."""
    response = document["$defs"]["CreateCompletionResponse"]["properties"]
    choice = response["choices"]["items"]["properties"]
    choice["finish_reason"] = _nullable(choice["finish_reason"])
    response["usage"] = _nullable(response["usage"])


def _relax_runner(document: dict[str, Any]) -> None:
    """A ``Model`` may carry our extension ``runner``: ``{"name": "llama" | "transformers", "reason"}``."""
    document["$defs"]["Model"]["properties"]["runner"] = {
        "type": "object",
        "properties": {"name": {"enum": ["llama", "transformers"]}, "reason": {"type": "string"}},
        "required": ["name", "reason"],
        "additionalProperties": False,
    }


@cache
def _validator(name: str, *relaxations: str) -> Draft202012Validator:
    document = copy.deepcopy(_document())
    for relaxation in relaxations:
        {"echo": _relax_echo, "stream": _relax_stream, "runner": _relax_runner}[relaxation](document)
    return Draft202012Validator({**document, "$ref": f"#/$defs/{name}"})


def validate(name: str, instance: Any, *relaxations: str) -> None:
    """Pass if ``instance`` is a valid (closed) ``name``, with the given documented relaxations."""
    error = best_match(_validator(name, *relaxations).iter_errors(instance))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "(root)"
        raise AssertionError(f"not a valid {name} ({', '.join(relaxations) or 'strict'}) at {where}: {error.message}")


def test_the_closed_schemas_still_accept_openais_documented_example():
    validate(
        "CreateCompletionResponse",
        {
            "id": "cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7",
            "object": "text_completion",
            "created": 1589478378,
            "model": "gpt-3.5-turbo-instruct",
            "choices": [{"text": "\n\nThis is indeed a test", "index": 0, "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        },
    )


def test_the_relaxations_are_narrow():
    chunk = {
        "id": "cmpl-x",
        "object": "text_completion",
        "created": 1,
        "model": MODEL,
        "usage": None,
        "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": None}],
    }
    validate("CreateCompletionResponse", chunk, "stream")
    with pytest.raises(AssertionError):
        validate("CreateCompletionResponse", chunk)
    with pytest.raises(AssertionError):
        validate("CreateCompletionResponse", {**chunk, "surprise": 1}, "stream")
    echoed = {"tokens": ["A"], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]}
    response = {
        **chunk,
        "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1},
        "choices": [{"text": "A", "index": 0, "logprobs": echoed, "finish_reason": "length"}],
    }
    validate("CreateCompletionResponse", response, "echo")
    with pytest.raises(AssertionError):
        validate("CreateCompletionResponse", response)
    model = {
        "id": MODEL,
        "object": "model",
        "created": 1,
        "owned_by": "me",
        "runner": {"name": "llama", "reason": "the llama family"},
    }
    validate("Model", model, "runner")
    with pytest.raises(AssertionError):
        validate("Model", model)
    with pytest.raises(AssertionError):
        validate("Model", {**model, "runner": {"name": "llama", "reason": "", "surprise": 1}}, "runner")


# --- The request matrix -------------------------------------------------------------------------

# (id, body without model, whether a stream of it is allowed).  Together they send every field of
# CreateCompletionRequest, each prompt form, and the nulls that mean "the default".
MATRIX: list[tuple[str, dict[str, Any], bool]] = [
    ("defaults", {"prompt": PROMPT, "max_tokens": 3}, True),
    ("greedy_with_stop", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stop": [".", "\n"]}, True),
    ("array_of_strings_with_n", {"prompt": [PROMPT, OTHER], "n": 2, "max_tokens": 2, "seed": 3}, True),
    ("token_ids", {"prompt": [504, 3575, 282, 4649, 314], "max_tokens": 3, "temperature": 0}, True),
    (
        "arrays_of_token_ids_echoed",
        {"prompt": [[504, 3575], [282]], "echo": True, "max_tokens": 2, "temperature": 0},
        True,
    ),
    ("logprobs", {"prompt": PROMPT, "logprobs": 3, "max_tokens": 3, "temperature": 0}, True),
    ("echo_with_logprobs", {"prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 3, "temperature": 0}, True),
    ("echo_scoring", {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0}, True),
    ("best_of", {"prompt": PROMPT, "best_of": 3, "n": 2, "max_tokens": 3, "seed": 5, "logprobs": 1}, False),
    (
        "penalties_and_bias",
        {
            "prompt": PROMPT,
            "presence_penalty": 1.5,
            "frequency_penalty": -0.5,
            "logit_bias": {**NO_EOS, "17": 5},
            "max_tokens": 3,
            "temperature": 0,
        },
        True,
    ),
    ("nucleus_sampling", {"prompt": PROMPT, "temperature": 0.7, "top_p": 0.9, "seed": 42, "max_tokens": 3}, True),
    (
        "user_and_nulls",
        {
            "prompt": PROMPT,
            "user": "conformance-user",
            "suffix": None,
            "stop": None,
            "logprobs": None,
            "seed": None,
            "best_of": None,
            "max_tokens": 2,
        },
        True,
    ),
    ("empty_suffix", {"prompt": PROMPT, "suffix": "", "max_tokens": 2, "temperature": 0}, True),
    ("non_latin", {"prompt": "Emoji: 😀 and 中文", "max_tokens": 3, "temperature": 0, "logprobs": 1}, True),
]


def _prompt_count(body: dict[str, Any]) -> int:
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def _deterministic(body: dict[str, Any]) -> bool:
    return body.get("temperature") == 0 or body.get("seed") is not None


def _relaxations(body: dict[str, Any]) -> tuple[str, ...]:
    return ("echo",) if body.get("echo") and body.get("logprobs") is not None else ()


def _check_echo_nulls(choice: dict[str, Any], echoed_first: bool) -> None:
    """Null logprobs only at the first echoed prompt token, numbers everywhere else."""
    logprobs = choice["logprobs"]
    if logprobs is None:
        return
    nulls = [k for k, value in enumerate(logprobs["token_logprobs"]) if value is None]
    assert nulls == ([0] if echoed_first else [])
    assert [k for k, value in enumerate(logprobs["top_logprobs"]) if value is None] == nulls


@pytest.fixture(scope="module")
def answers(server) -> dict[str, dict[str, Any]]:
    """Each matrix request, answered once as JSON."""
    return {name: complete(server, **body) for name, body, _ in MATRIX}


@pytest.mark.parametrize(("name", "body", "streamable"), MATRIX, ids=[case[0] for case in MATRIX])
def test_every_response_is_a_create_completion_response(answers, name, body, streamable):
    answer = answers[name]
    validate("CreateCompletionResponse", answer, *_relaxations(body))
    assert answer["id"].startswith("cmpl-") and answer["object"] == "text_completion" and answer["model"] == MODEL
    n = body.get("n") or 1
    assert [choice["index"] for choice in answer["choices"]] == list(range(_prompt_count(body) * n))
    assert all(choice["finish_reason"] in ("stop", "length") for choice in answer["choices"])
    assert all((choice["logprobs"] is None) == (body.get("logprobs") is None) for choice in answer["choices"])
    for choice in answer["choices"]:
        _check_echo_nulls(choice, echoed_first=bool(body.get("echo")))
    usage = answer["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] >= _prompt_count(body)


def test_user_is_stored_with_the_usage_record(server, answers):
    answer = answers["user_and_nulls"]
    record = server.usage(answer["id"])
    assert record["user"] == "conformance-user"
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        answer["usage"]["prompt_tokens"],
        answer["usage"]["completion_tokens"],
    )


@pytest.mark.parametrize(
    ("name", "body", "include_usage"),
    [(name, body, k % 2 == 0) for k, (name, body, streamable) in enumerate(MATRIX) if streamable],
    ids=[name for name, _, streamable in MATRIX if streamable],
)
def test_every_stream_chunk_is_a_create_completion_response_with_openais_stream_nulls(
    server, answers, name, body, include_usage
):
    fields = {**body, "stream": True}
    if include_usage:
        fields["stream_options"] = {"include_usage": True}
    chunks = stream_events(server, **fields)
    for chunk in chunks:
        validate("CreateCompletionResponse", chunk, "stream", *_relaxations(body))
    assert len({(c["id"], c["object"], c["created"], c["model"]) for c in chunks}) == 1
    assert chunks[0]["id"].startswith("cmpl-") and chunks[0]["object"] == "text_completion"

    if include_usage:
        *chunks, last = chunks
        assert last["choices"] == [] and last["usage"] is not None
        assert all(chunk["usage"] is None for chunk in chunks)
        assert last["usage"]["prompt_tokens"] == answers[name]["usage"]["prompt_tokens"]
    else:
        assert all("usage" not in chunk for chunk in chunks)

    n = body.get("n") or 1
    last_of: dict[int, int] = {}
    for position, chunk in enumerate(chunks):
        assert len(chunk["choices"]) >= 1
        for choice in chunk["choices"]:
            last_of[choice["index"]] = position
    assert sorted(last_of) == list(range(_prompt_count(body) * n))
    for position, chunk in enumerate(chunks):
        for choice in chunk["choices"]:
            is_last = last_of[choice["index"]] == position
            assert (choice["finish_reason"] is not None) == is_last
            assert choice["finish_reason"] in (None, "stop", "length")

    merged = merge_stream(chunks)
    for choice in merged:
        _check_echo_nulls(choice, echoed_first=bool(body.get("echo")))
    if _deterministic(body):
        assert merged == answers[name]["choices"]
        if include_usage:
            assert last["usage"] == answers[name]["usage"]


# --- The official client ------------------------------------------------------------------------


def test_openai_client_reads_every_field_of_a_response(openai_client):
    raw = openai_client.completions.with_raw_response.create(
        model=MODEL,
        prompt=[PROMPT, OTHER],
        n=2,
        best_of=2,
        echo=True,
        logprobs=2,
        max_tokens=3,
        temperature=0.8,
        top_p=0.95,
        seed=9,
        stop=["\n\n"],
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias=NO_EOS,
        user="client-user",
        suffix=None,
    )
    body = raw.http_response.json()
    validate("CreateCompletionResponse", body, "echo")
    completion = raw.parse()
    assert completion.id == body["id"] and completion.created == body["created"] and completion.model == MODEL
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    for parsed, choice in zip(completion.choices, body["choices"]):
        assert parsed.text == choice["text"] and parsed.finish_reason == choice["finish_reason"]
        assert parsed.logprobs.tokens == choice["logprobs"]["tokens"]
        assert parsed.logprobs.token_logprobs == choice["logprobs"]["token_logprobs"]
        assert parsed.logprobs.text_offset == choice["logprobs"]["text_offset"]
        assert parsed.logprobs.top_logprobs == choice["logprobs"]["top_logprobs"]
    assert completion.usage.total_tokens == body["usage"]["total_tokens"]


def test_openai_client_stream_chunks_conform_and_end_with_the_usage_chunk(openai_client):
    chunks = list(
        openai_client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            n=2,
            max_tokens=3,
            seed=4,
            logprobs=1,
            logit_bias=NO_EOS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    for chunk in chunks:
        validate("CreateCompletionResponse", chunk.to_dict(), "stream")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert {choice.index for chunk in chunks[:-1] for choice in chunk.choices} == {0, 1}


def test_openai_client_lists_and_retrieves_the_model_in_openais_shape(openai_client):
    listed = openai_client.models.with_raw_response.list()
    validate("ListModelsResponse", listed.http_response.json(), "runner")
    assert [model.id for model in listed.parse().data] == [MODEL]
    retrieved = openai_client.models.with_raw_response.retrieve(MODEL)
    validate("Model", retrieved.http_response.json(), "runner")
    assert retrieved.parse().owned_by


def test_openai_client_raises_bad_request_with_an_error_response(openai_client):
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.completions.create(model=MODEL, prompt=PROMPT, temperature=2.5)
    validate("ErrorResponse", raised.value.response.json())
    assert raised.value.body == {
        "message": "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 2.5 instead.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "decimal_above_max_value",
    }


def test_openai_client_raises_not_found_for_an_unknown_model(openai_client):
    with pytest.raises(openai.NotFoundError) as raised:
        openai_client.completions.create(model="gpt-4-nonexistent", prompt=PROMPT)
    validate("ErrorResponse", raised.value.response.json())
    assert raised.value.code == "model_not_found" and raised.value.param == "model"


# --- Models and errors over raw HTTP ------------------------------------------------------------


def test_models_routes_answer_in_openais_shape(server):
    listed = httpx.get(server.api_url + "/models", headers=server.headers())
    validate("ListModelsResponse", listed.json(), "runner")
    for model in listed.json()["data"]:
        validate("Model", model, "runner")
        assert httpx.get(f"{server.api_url}/models/{model['id']}", headers=server.headers()).json() == model
    missing = httpx.get(server.api_url + "/models/no-such-model", headers=server.headers())
    assert missing.status_code == 404
    validate("ErrorResponse", missing.json())
    unauthorised = httpx.get(server.api_url + "/models")
    assert unauthorised.status_code == 401
    validate("ErrorResponse", unauthorised.json())


VALID = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1}

# (id, body: a dict merged over VALID, or raw bytes; status; param; code; exact message or None)
ERRORS: list[tuple[str, dict[str, Any] | bytes, int, str | None, str | None, str | None]] = [
    ("not_json", b"{not json", 400, None, None, None),
    ("not_an_object", b"[1, 2]", 400, None, "invalid_type", None),
    ("unknown_field", {"temprature": 1}, 400, None, None, "Unrecognized request argument supplied: temprature"),
    (
        "missing_model",
        {"model": ...},
        400,
        "model",
        "missing_required_parameter",
        "Missing required parameter: 'model'.",
    ),
    (
        "missing_prompt",
        {"prompt": ...},
        400,
        "prompt",
        "missing_required_parameter",
        "Missing required parameter: 'prompt'.",
    ),
    ("model_type", {"model": 1}, 400, "model", "invalid_type", None),
    ("prompt_type", {"prompt": {"text": "x"}}, 400, "prompt", "invalid_type", None),
    ("prompt_mixed_forms", {"prompt": ["a", 1]}, 400, "prompt[1]", "invalid_type", None),
    ("prompt_empty_list", {"prompt": []}, 400, "prompt", "empty_array", None),
    ("prompt_empty_token_list", {"prompt": [[]]}, 400, "prompt[0]", "empty_array", None),
    (
        "prompt_negative_token",
        {"prompt": [1, -1]},
        400,
        "prompt[1]",
        "integer_below_min_value",
        "Invalid 'prompt[1]': integer below minimum value. Expected a value >= 0, but got -1 instead.",
    ),
    ("prompt_token_beyond_vocabulary", {"prompt": [10**9]}, 400, "prompt[0]", "integer_above_max_value", None),
    ("prompt_fractional_token", {"prompt": [1.5]}, 400, "prompt[0]", "invalid_type", None),
    ("prompt_boolean_token", {"prompt": [True]}, 400, "prompt[0]", "invalid_type", None),
    ("best_of_type", {"best_of": "3"}, 400, "best_of", "invalid_type", None),
    ("best_of_below_n", {"best_of": 1, "n": 2}, 400, "best_of", "integer_below_min_value", None),
    ("best_of_with_stream", {"best_of": 2, "stream": True}, 400, "best_of", "invalid_value", None),
    (
        "best_of_above_cap",
        {"best_of": 21},
        400,
        "best_of",
        "integer_above_max_value",
        "Invalid 'best_of': integer above maximum value. Expected a value <= 20, but got 21 instead.",
    ),
    ("echo_type", {"echo": "yes"}, 400, "echo", "invalid_type", None),
    (
        "frequency_penalty_range",
        {"frequency_penalty": 2.5},
        400,
        "frequency_penalty",
        "decimal_above_max_value",
        "Invalid 'frequency_penalty': decimal above maximum value. Expected a value <= 2, but got 2.5 instead.",
    ),
    ("logit_bias_type", {"logit_bias": [1]}, 400, "logit_bias", "invalid_type", None),
    ("logit_bias_key", {"logit_bias": {"one": 1}}, 400, "logit_bias", "invalid_value", None),
    (
        "logit_bias_value",
        {"logit_bias": {"1": 101}},
        400,
        "logit_bias.1",
        "integer_above_max_value",
        "Invalid 'logit_bias.1': integer above maximum value. Expected a value <= 100, but got 101 instead.",
    ),
    ("logit_bias_fraction", {"logit_bias": {"1": 0.5}}, 400, "logit_bias.1", "invalid_type", None),
    ("logit_bias_beyond_vocabulary", {"logit_bias": {"99999999": 1}}, 400, "logit_bias", "invalid_value", None),
    (
        "logprobs_range",
        {"logprobs": 6},
        400,
        "logprobs",
        "integer_above_max_value",
        "Invalid 'logprobs': integer above maximum value. Expected a value <= 5, but got 6 instead.",
    ),
    (
        "logprobs_negative",
        {"logprobs": -1},
        400,
        "logprobs",
        "integer_below_min_value",
        "Invalid 'logprobs': integer below minimum value. Expected a value >= 0, but got -1 instead.",
    ),
    ("max_tokens_type", {"max_tokens": "ten"}, 400, "max_tokens", "invalid_type", None),
    ("max_tokens_negative", {"max_tokens": -1}, 400, "max_tokens", "integer_below_min_value", None),
    ("max_tokens_zero_without_echo", {"max_tokens": 0}, 400, "max_tokens", "integer_below_min_value", None),
    (
        "n_range",
        {"n": 0},
        400,
        "n",
        "integer_below_min_value",
        "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead.",
    ),
    (
        "presence_penalty_range",
        {"presence_penalty": -2.5},
        400,
        "presence_penalty",
        "decimal_below_min_value",
        "Invalid 'presence_penalty': decimal below minimum value. Expected a value >= -2, but got -2.5 instead.",
    ),
    ("seed_type", {"seed": "42"}, 400, "seed", "invalid_type", None),
    ("seed_range", {"seed": 2**64}, 400, "seed", "integer_above_max_value", None),
    ("stop_type", {"stop": 5}, 400, "stop", "invalid_type", None),
    ("stop_too_many", {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "array_above_max_length", None),
    ("stream_type", {"stream": "true"}, 400, "stream", "invalid_type", None),
    ("stream_options_without_stream", {"stream_options": {"include_usage": True}}, 400, "stream_options", None, None),
    (
        "stream_options_type",
        {"stream": True, "stream_options": {"include_usage": "yes"}},
        400,
        "stream_options.include_usage",
        "invalid_type",
        None,
    ),
    ("suffix_type", {"suffix": 5}, 400, "suffix", "invalid_type", None),
    ("suffix_without_fim_tokens", {"suffix": "return x"}, 400, "suffix", "unsupported_parameter", None),
    (
        "temperature_range",
        {"temperature": 2.5},
        400,
        "temperature",
        "decimal_above_max_value",
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 2.5 instead.",
    ),
    ("temperature_boolean", {"temperature": True}, 400, "temperature", "invalid_type", None),
    (
        "top_p_range",
        {"top_p": 1.5},
        400,
        "top_p",
        "decimal_above_max_value",
        "Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got 1.5 instead.",
    ),
    ("user_type", {"user": 5}, 400, "user", "invalid_type", None),
    ("context_overflow", {"prompt": "hello " * 9000}, 400, "prompt", "context_length_exceeded", None),
    (
        "context_overflow_streamed",
        {"prompt": "hello " * 9000, "stream": True},
        400,
        "prompt",
        "context_length_exceeded",
        None,
    ),
    ("unknown_model", {"model": "gpt-4-nonexistent"}, 404, "model", "model_not_found", None),
]


def _error_body(body: dict[str, Any] | bytes) -> bytes:
    if isinstance(body, bytes):
        return body
    merged = {**VALID, **body}
    return json.dumps({name: value for name, value in merged.items() if value is not ...}).encode()


@pytest.mark.parametrize(("name", "body", "status", "param", "code", "message"), ERRORS, ids=[e[0] for e in ERRORS])
def test_every_bad_request_is_an_error_response_naming_the_param(server, name, body, status, param, code, message):
    response = server.post(_error_body(body))
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    validate("ErrorResponse", response.json())
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)
    if param is not None:
        assert param in error["message"]
    if message is not None:
        assert error["message"] == message
    if name.startswith("context_overflow"):
        assert "maximum context length is 8192 tokens" in error["message"] and "in your prompt" in error["message"]


def test_a_request_without_a_key_is_an_error_response(server):
    response = httpx.post(server.api_url + "/completions", json=VALID)
    assert response.status_code == 401
    validate("ErrorResponse", response.json())
