"""``parse_completion_request``: what a ``/v1/completions`` body may be, and how a bad one is refused.

Every refusal is a 400 ``invalid_request_error`` naming the offending ``param``, with OpenAI's
``code`` and words (``"Invalid 'stop': array too long. ..."``); every accepted body becomes a ``CompletionRequest`` with
OpenAI's defaults.  No database: these are pure functions of the body and the settings.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.completions.protocol import CompletionRequest, parse_completion_request
from api.errors import APIError
from api.protocol import INVALID_JSON_MESSAGE, body_too_large_error
from inference.sampling import SamplingParams
from tests.openai_schema import validate

BASE = {"model": "smollm2-135m-instruct", "prompt": "Say this is a test"}


def body(**fields: Any) -> bytes:
    """A JSON body: the minimal valid request with ``fields`` added (a ``None`` value removes it)."""
    merged = {**BASE, **fields}
    return json.dumps({name: value for name, value in merged.items() if value is not None}).encode()


def refusal(raw: bytes) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_completion_request(raw)
    return caught.value


# (id, body, param, code, exact message or None when only param and code are pinned)
BAD_BODIES = [
    ("invalid_json", b'{"model": "m", "prompt": ', None, None, INVALID_JSON_MESSAGE),
    ("empty_body", b"", None, None, INVALID_JSON_MESSAGE),
    ("not_utf8", b'{"model": "\xff"}', None, None, INVALID_JSON_MESSAGE),
    ("nan_is_not_json", body(temperature=None)[:-1] + b', "temperature": NaN}', None, None, INVALID_JSON_MESSAGE),
    ("deeply_nested", b"[" * 100_000, None, None, INVALID_JSON_MESSAGE),
    (
        "array_body",
        b"[]",
        None,
        "invalid_type",
        "Invalid type for the request body: expected an object, but got an array instead.",
    ),
    (
        "string_body",
        b'"hello"',
        None,
        "invalid_type",
        "Invalid type for the request body: expected an object, but got a string instead.",
    ),
    (
        "missing_model",
        json.dumps({"prompt": "x"}).encode(),
        "model",
        "missing_required_parameter",
        "Missing required parameter: 'model'.",
    ),
    (
        "missing_prompt",
        json.dumps({"model": "m"}).encode(),
        "prompt",
        "missing_required_parameter",
        "Missing required parameter: 'prompt'.",
    ),
    ("null_model", body(model=None)[:-1] + b', "model": null}', "model", "invalid_type", None),
    (
        "model_not_a_string",
        body(model=5),
        "model",
        "invalid_type",
        "Invalid type for 'model': expected a string, but got an integer instead.",
    ),
    (
        "temperature_above_2",
        body(temperature=2.5),
        "temperature",
        "decimal_above_max_value",
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 2.5 instead.",
    ),
    (
        "temperature_negative",
        body(temperature=-0.5),
        "temperature",
        "decimal_below_min_value",
        "Invalid 'temperature': decimal below minimum value. Expected a value >= 0, but got -0.5 instead.",
    ),
    (
        "top_p_negative",
        body(top_p=-0.1),
        "top_p",
        "decimal_below_min_value",
        "Invalid 'top_p': decimal below minimum value. Expected a value >= 0, but got -0.1 instead.",
    ),
    (
        "top_p_above_1",
        body(top_p=1.5),
        "top_p",
        "decimal_above_max_value",
        "Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got 1.5 instead.",
    ),
    (
        "n_zero",
        body(n=0),
        "n",
        "integer_below_min_value",
        "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead.",
    ),
    (
        "n_above_server_cap",
        body(n=21),
        "n",
        "integer_above_max_value",
        "Invalid 'n': integer above maximum value. Expected a value <= 20, but got 21 instead.",
    ),
    (
        "best_of_below_n",
        body(n=3, best_of=2),
        "best_of",
        "integer_below_min_value",
        "Invalid 'best_of': integer below minimum value. Expected a value >= 3, but got 2 instead. best_of must be greater than or equal to n.",
    ),
    ("best_of_with_stream", body(best_of=2, stream=True), "best_of", "invalid_value", None),
    (
        "best_of_above_spec_max",
        body(best_of=21, n=1),
        "best_of",
        "integer_above_max_value",
        "Invalid 'best_of': integer above maximum value. Expected a value <= 20, but got 21 instead.",
    ),
    (
        "logprobs_above_server_cap",
        body(logprobs=6),
        "logprobs",
        "integer_above_max_value",
        "Invalid 'logprobs': integer above maximum value. Expected a value <= 5, but got 6 instead.",
    ),
    (
        "logprobs_negative",
        body(logprobs=-1),
        "logprobs",
        "integer_below_min_value",
        "Invalid 'logprobs': integer below minimum value. Expected a value >= 0, but got -1 instead.",
    ),
    (
        "stop_five_strings",
        body(stop=["a", "b", "c", "d", "e"]),
        "stop",
        "array_above_max_length",
        "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length 5 instead.",
    ),
    (
        "stop_int",
        body(stop=1),
        "stop",
        "invalid_type",
        "Invalid type for 'stop': expected one of a string or an array of strings, but got an integer instead.",
    ),
    (
        "stop_empty_list",
        body(stop=[]),
        "stop",
        "empty_array",
        "Invalid 'stop': empty array. Expected an array with minimum length 1, but got an empty array instead.",
    ),
    (
        "stop_empty_string",
        body(stop=""),
        "stop",
        "empty_string",
        "Invalid 'stop': empty string. Expected a string with minimum length 1, but got an empty string instead.",
    ),
    (
        "stop_list_with_empty_string",
        body(stop=["\n", ""]),
        "stop[1]",
        "empty_string",
        "Invalid 'stop[1]': empty string. Expected a string with minimum length 1, but got an empty string instead.",
    ),
    ("logit_bias_key_not_a_token_id", body(logit_bias={"abc": 1}), "logit_bias", "invalid_value", None),
    ("logit_bias_negative_key", body(logit_bias={"-5": 1}), "logit_bias", "invalid_value", None),
    (
        "logit_bias_value_above_100",
        body(logit_bias={"50": 101}),
        "logit_bias.50",
        "integer_above_max_value",
        "Invalid 'logit_bias.50': integer above maximum value. Expected a value <= 100, but got 101 instead.",
    ),
    (
        "logit_bias_value_below_minus_100",
        body(logit_bias={"50": -101}),
        "logit_bias.50",
        "integer_below_min_value",
        "Invalid 'logit_bias.50': integer below minimum value. Expected a value >= -100, but got -101 instead.",
    ),
    (
        "logit_bias_value_not_integer",
        body(logit_bias={"50": 0.5}),
        "logit_bias.50",
        "invalid_type",
        "Invalid type for 'logit_bias.50': expected an integer, but got a decimal instead.",
    ),
    ("logit_bias_not_a_map", body(logit_bias=[1]), "logit_bias", "invalid_type", None),
    (
        "max_tokens_negative",
        body(max_tokens=-1),
        "max_tokens",
        "integer_below_min_value",
        "Invalid 'max_tokens': integer below minimum value. Expected a value >= 0, but got -1 instead.",
    ),
    (
        "max_tokens_a_string",
        body(max_tokens="10"),
        "max_tokens",
        "invalid_type",
        "Invalid type for 'max_tokens': expected an integer, but got a string instead.",
    ),
    (
        "max_tokens_a_bool",
        body(max_tokens=True),
        "max_tokens",
        "invalid_type",
        "Invalid type for 'max_tokens': expected an integer, but got a boolean instead.",
    ),
    ("max_tokens_fractional", body(max_tokens=1.5), "max_tokens", "invalid_type", None),
    (
        "max_tokens_zero_without_echo",
        body(max_tokens=0),
        "max_tokens",
        "integer_below_min_value",
        "Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got 0 instead. max_tokens may be 0 only with echo.",
    ),
    ("prompt_a_dict", body(prompt={"text": "hi"}), "prompt", "invalid_type", None),
    ("prompt_a_number", body(prompt=5), "prompt", "invalid_type", None),
    (
        "prompt_empty_list",
        body(prompt=[]),
        "prompt",
        "empty_array",
        "Invalid 'prompt': empty array. Expected an array with minimum length 1, but got an empty array instead.",
    ),
    (
        "prompt_empty_token_list",
        body(prompt=[[]]),
        "prompt[0]",
        "empty_array",
        "Invalid 'prompt[0]': empty array. Expected an array with minimum length 1, but got an empty array instead.",
    ),
    ("prompt_mixed_ids_and_text", body(prompt=[1, "a"]), "prompt[1]", "invalid_type", None),
    ("prompt_bool_token", body(prompt=[True]), "prompt[0]", "invalid_type", None),
    ("prompt_fractional_token", body(prompt=[1.5]), "prompt[0]", "invalid_type", None),
    (
        "prompt_negative_token",
        body(prompt=[-1]),
        "prompt[0]",
        "integer_below_min_value",
        "Invalid 'prompt[0]': integer below minimum value. Expected a value >= 0, but got -1 instead.",
    ),
    (
        "prompt_negative_token_in_batch",
        body(prompt=[[1], [2, -3]]),
        "prompt[1][1]",
        "integer_below_min_value",
        "Invalid 'prompt[1][1]': integer below minimum value. Expected a value >= 0, but got -3 instead.",
    ),
    ("prompt_lone_surrogate", body(prompt=None)[:-1] + b', "prompt": "\\ud800"}', "prompt", "invalid_value", None),
    (
        "stream_options_without_stream",
        body(stream_options={"include_usage": True}),
        "stream_options",
        None,
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    ),
    (
        "stream_options_with_stream_false",
        body(stream=False, stream_options={"include_usage": True}),
        "stream_options",
        None,
        None,
    ),
    (
        "stream_options_include_usage_not_bool",
        body(stream=True, stream_options={"include_usage": 1}),
        "stream_options.include_usage",
        "invalid_type",
        "Invalid type for 'stream_options.include_usage': expected a boolean, but got an integer instead.",
    ),
    (
        "stream_not_bool",
        body(stream="yes"),
        "stream",
        "invalid_type",
        "Invalid type for 'stream': expected a boolean, but got a string instead.",
    ),
    ("echo_not_bool", body(echo=1), "echo", "invalid_type", None),
    (
        "presence_penalty_above_2",
        body(presence_penalty=3),
        "presence_penalty",
        "decimal_above_max_value",
        "Invalid 'presence_penalty': decimal above maximum value. Expected a value <= 2, but got 3 instead.",
    ),
    (
        "frequency_penalty_below_minus_2",
        body(frequency_penalty=-2.5),
        "frequency_penalty",
        "decimal_below_min_value",
        None,
    ),
    (
        "seed_beyond_int64",
        body(seed=2**63),
        "seed",
        "integer_above_max_value",
        "Invalid 'seed': integer above maximum value. Expected a value <= 9223372036854775807, but got 9223372036854775808 instead.",
    ),
    ("seed_a_string", body(seed="42"), "seed", "invalid_type", None),
    (
        "user_not_a_string",
        body(user=5),
        "user",
        "invalid_type",
        "Invalid type for 'user': expected a string, but got an integer instead.",
    ),
    ("unknown_field", body(foo=1), None, None, "Unrecognized request argument supplied: foo"),
    ("unknown_fields", body(foo=1, bar=2), None, None, "Unrecognized request arguments supplied: bar, foo"),
    ("chat_messages_on_completions", body(messages=[]), None, None, "Unrecognized request argument supplied: messages"),
]


@pytest.mark.parametrize(
    ("raw", "param", "code", "message"), [case[1:] for case in BAD_BODIES], ids=[case[0] for case in BAD_BODIES]
)
def test_bad_body_is_a_400_with_openais_code_naming_the_param(
    raw: bytes, param: str | None, code: str | None, message: str | None
) -> None:
    error = refusal(raw)
    payload = error.to_dict()
    assert error.status == 400
    assert payload["error"]["type"] == "invalid_request_error"
    assert (payload["error"]["param"], payload["error"]["code"]) == (param, code)
    assert list(payload["error"]) == ["message", "type", "param", "code"]
    validate("ErrorResponse", payload)
    if param is not None:
        assert f"'{param}'" in payload["error"]["message"]
    if message is not None:
        assert payload["error"]["message"] == message


def test_temperature_above_range_reads_exactly_like_openai() -> None:
    error = refusal(body(temperature=2.5))
    assert error.to_dict() == {
        "error": {
            "message": "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 2.5 instead.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "decimal_above_max_value",
        }
    }


def test_missing_model_is_reported_before_other_errors() -> None:
    error = refusal(json.dumps({"prompt": "x", "temperature": 9}).encode())
    assert error.param == "model"


def test_unknown_field_is_reported_before_schema_errors() -> None:
    assert refusal(body(temperature=9, foo=1)).message == "Unrecognized request argument supplied: foo"


def test_first_bad_field_in_spec_order_wins_whatever_the_client_order() -> None:
    one = refusal(json.dumps({"model": "m", "prompt": "x", "top_p": 7, "temperature": 9}).encode())
    other = refusal(json.dumps({"top_p": 7, "temperature": 9, "model": "m", "prompt": "x"}).encode())
    assert one.to_dict() == other.to_dict()


def test_huge_bad_value_is_cut_short_in_the_message() -> None:
    error = refusal(body(prompt={"text": "x" * 100_000}))
    assert error.param == "prompt"
    assert len(error.message) < 500


def test_bool_is_not_an_integer_anywhere() -> None:
    for field in ("n", "best_of", "logprobs", "max_tokens", "seed"):
        assert refusal(body(**{field: True})).param == field


def test_logprobs_cap_follows_the_setting(settings) -> None:
    settings.API_MAX_LOGPROBS = 10
    assert parse_completion_request(body(logprobs=6)).logprobs == 6
    assert refusal(body(logprobs=11)).message == (
        "Invalid 'logprobs': integer above maximum value. Expected a value <= 10, but got 11 instead."
    )


def test_n_cap_follows_the_setting(settings) -> None:
    settings.API_MAX_N = 4
    assert parse_completion_request(body(n=4)).n == 4
    assert (
        refusal(body(n=5)).message
        == "Invalid 'n': integer above maximum value. Expected a value <= 4, but got 5 instead."
    )


def test_body_too_large_is_a_413_request_too_large() -> None:
    error = body_too_large_error(4096)
    assert error.status == 413
    assert error.to_dict()["error"]["type"] == "invalid_request_error"
    assert error.code == "request_too_large"
    assert "4096" in error.message


def test_huge_token_id_prompt_is_checked_without_jsonschema_walking_it() -> None:
    # A 4 MB body holds about a million token ids (jsonschema alone took 5-30 s of CPU over them).
    ids = list(range(1000)) * 1000
    request = parse_completion_request(body(prompt=ids))
    assert len(request.prompts[0]) == 1_000_000
    assert refusal(body(prompt=[*ids, "x"])).param == "prompt[1000000]"


def test_huge_stop_list_is_refused_without_jsonschema_walking_it() -> None:
    error = refusal(body(stop=["a"] * 1_000_000))
    assert (error.param, error.code) == ("stop", "array_above_max_length")
    assert "but got an array with length 1000000 instead" in error.message


PROMPT_SAMPLES = [
    "",
    "text",
    [],
    ["a"],
    ["a", ""],
    [0],
    [1, 2],
    [2.0],
    [1.5],
    [True],
    [None],
    [[0]],
    [[1, 2], [3]],
    [[]],
    [[1], []],
    [[1], "a"],
    [1, "a"],
    ["a", 1],
    [["a"]],
    [[True]],
    [[1.0, 2]],
    [[1.5]],
    [[[1]]],
    [{}],
    {},
    5,
    True,
]


@pytest.mark.parametrize("prompt", PROMPT_SAMPLES, ids=[repr(p) for p in PROMPT_SAMPLES])
def test_prompt_check_in_python_agrees_with_the_spec_schema(prompt: Any) -> None:
    from api.protocol import spec_validator

    in_spec = spec_validator("CreateCompletionRequest").is_valid({"model": "m", "prompt": prompt})
    try:
        parse_completion_request(body(prompt=prompt))
        accepted = True
    except APIError as error:
        assert error.param.startswith("prompt")
        accepted = prompt == []  # the one prompt the spec allows and we refuse (an empty batch)
    assert accepted == in_spec


@pytest.mark.parametrize("bias", [1, 1.0, -100, 0.5, "1", True, None, [1], {}])
def test_logit_bias_value_check_in_python_agrees_with_the_spec_schema(bias: Any) -> None:
    from api.protocol import spec_validator

    instance = {"model": "m", "prompt": "", "logit_bias": {"1": bias}}
    in_spec = spec_validator("CreateCompletionRequest").is_valid(instance)
    try:
        parse_completion_request(body(logit_bias={"1": bias}))
        accepted = True
    except APIError as error:
        assert error.param == "logit_bias.1"
        accepted = False
    assert accepted == in_spec


# --- Accepted bodies ----------------------------------------------------------------------------


def test_minimal_body_gets_openai_defaults() -> None:
    request = parse_completion_request(body())
    assert request == CompletionRequest(model="smollm2-135m-instruct", prompt="Say this is a test")
    assert (request.best_of, request.echo, request.max_tokens, request.n, request.stream) == (1, False, 16, 1, False)
    assert (request.temperature, request.top_p, request.frequency_penalty, request.presence_penalty) == (1, 1, 0, 0)
    assert request.logit_bias is request.logprobs is request.seed is request.stop is request.suffix is None


def test_minimal_body_samples_with_openai_defaults() -> None:
    assert parse_completion_request(body()).sampling_params() == SamplingParams(
        max_tokens=16,
        temperature=1.0,
        top_p=1.0,
        n=1,
        best_of=1,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        logit_bias={},
        seed=None,
        stop=(),
        logprobs=None,
        prompt_logprobs=False,
        ignore_eos=False,
    )


def test_null_means_the_default_for_every_optional_field() -> None:
    optional = [
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    ]
    raw = json.dumps({**BASE, **dict.fromkeys(optional)}).encode()
    assert parse_completion_request(raw) == parse_completion_request(body())


def test_null_prompt_is_the_spec_default_document_separator() -> None:
    raw = json.dumps({"model": "m", "prompt": None}).encode()
    assert parse_completion_request(raw).prompts == ["<|endoftext|>"]


def test_full_body_parses_field_by_field() -> None:
    request = parse_completion_request(
        body(
            prompt=[[1, 2], [3]],
            best_of=4,
            n=2,
            echo=True,
            frequency_penalty=0.5,
            presence_penalty=-1,
            logit_bias={"50": -100, "7": 100},
            logprobs=3,
            max_tokens=0,
            seed=42,
            stop=["\n", "END"],
            temperature=0,
            top_p=0.9,
            user="user-1234",
        )
    )
    assert request == CompletionRequest(
        model="smollm2-135m-instruct",
        prompt=[[1, 2], [3]],
        best_of=4,
        echo=True,
        frequency_penalty=0.5,
        logit_bias={"50": -100, "7": 100},
        logprobs=3,
        max_tokens=0,
        n=2,
        presence_penalty=-1.0,
        seed=42,
        stop=["\n", "END"],
        temperature=0.0,
        top_p=0.9,
        user="user-1234",
    )
    assert request.sampling_params(ignore_eos=True) == SamplingParams(
        max_tokens=0,
        temperature=0.0,
        top_p=0.9,
        n=2,
        best_of=4,
        presence_penalty=-1.0,
        frequency_penalty=0.5,
        logit_bias={50: -100.0, 7: 100.0},
        seed=42,
        stop=("\n", "END"),
        logprobs=3,
        prompt_logprobs=True,
        ignore_eos=True,
    )


def test_integral_floats_become_ints() -> None:
    request = parse_completion_request(body(max_tokens=5.0, n=2.0, prompt=[1.0, 2.0], logit_bias={"1": 3.0}))
    assert (request.max_tokens, request.n, request.prompt, request.logit_bias) == (5, 2, [1, 2], {"1": 3})
    assert all(type(value) is int for value in (request.max_tokens, request.n, *request.prompt))


def test_n_without_best_of_samples_n_candidates() -> None:
    request = parse_completion_request(body(n=3))
    assert request.best_of == 1
    assert request.sampling_params().best_of == 3


def test_n_with_stream_is_allowed() -> None:
    assert parse_completion_request(body(n=3, stream=True)).stream


def test_best_of_one_with_stream_is_allowed() -> None:
    assert parse_completion_request(body(best_of=1, stream=True)).best_of == 1


def test_logprobs_without_echo_does_not_ask_for_prompt_logprobs() -> None:
    params = parse_completion_request(body(logprobs=0)).sampling_params()
    assert (params.logprobs, params.prompt_logprobs) == (0, False)


def test_echo_without_logprobs_does_not_ask_for_prompt_logprobs() -> None:
    assert parse_completion_request(body(echo=True)).sampling_params().prompt_logprobs is False


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("hello", ["hello"]),
        ("", [""]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
    ids=["string", "empty_string", "strings", "token_ids", "token_id_lists"],
)
def test_every_prompt_form_normalises_to_a_list_of_prompts(prompt: Any, prompts: list) -> None:
    assert parse_completion_request(body(prompt=prompt)).prompts == prompts


@pytest.mark.parametrize(
    ("stop", "sequences"),
    [(None, ()), ("\n", ("\n",)), (["a", "b", "c", "d"], ("a", "b", "c", "d"))],
    ids=["none", "string", "four_strings"],
)
def test_stop_becomes_a_tuple_of_sequences(stop: Any, sequences: tuple[str, ...]) -> None:
    request = parse_completion_request(body(stop=stop))
    assert request.stop_sequences == sequences
    assert request.sampling_params().stop == sequences


@pytest.mark.parametrize(
    ("fields", "include_usage"),
    [
        ({}, False),
        ({"stream": True}, False),
        ({"stream": True, "stream_options": {}}, False),
        ({"stream": True, "stream_options": {"include_usage": False}}, False),
        ({"stream": True, "stream_options": {"include_usage": True}}, True),
    ],
    ids=["no_stream", "stream_only", "empty_options", "usage_false", "usage_true"],
)
def test_usage_chunk_only_when_streaming_with_include_usage(fields: dict, include_usage: bool) -> None:
    assert parse_completion_request(body(**fields)).include_usage is include_usage


def test_unknown_stream_options_keys_are_ignored_like_openai() -> None:
    request = parse_completion_request(body(stream=True, stream_options={"include_obfuscation": False, "x": 1}))
    assert request.include_usage is False


def test_empty_suffix_is_no_suffix() -> None:
    assert parse_completion_request(body(suffix="")).suffix == ""


def test_max_tokens_zero_is_allowed_with_echo() -> None:
    assert parse_completion_request(body(max_tokens=0, echo=True)).max_tokens == 0


def test_logit_bias_bounds_are_inclusive() -> None:
    request = parse_completion_request(body(logit_bias={"0": -100, "1": 100}))
    assert request.sampling_params().logit_bias == {0: -100.0, 1: 100.0}


def test_unicode_prompt_and_stop_pass_through() -> None:
    request = parse_completion_request(body(prompt="héllo 🌍", stop="🌍"))
    assert (request.prompt, request.stop_sequences) == ("héllo 🌍", ("🌍",))


# --- Checks that need the model -----------------------------------------------------------------


def test_token_ids_inside_the_vocabulary_pass() -> None:
    parse_completion_request(body(prompt=[[0, 99]], logit_bias={"99": 5})).check_token_ids(vocab_size=100)


def test_text_prompts_have_no_token_ids_to_check() -> None:
    parse_completion_request(body(prompt=["a", "b"])).check_token_ids(vocab_size=1)


def test_prompt_token_id_beyond_the_vocabulary_is_a_400_naming_it() -> None:
    request = parse_completion_request(body(prompt=[5, 100]))
    with pytest.raises(APIError) as caught:
        request.check_token_ids(vocab_size=100)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, "prompt[1]", "integer_above_max_value")
    assert "100" in caught.value.message and "vocabulary has 100 tokens" in caught.value.message


def test_negative_token_id_fails_the_vocabulary_check_too() -> None:
    with pytest.raises(APIError) as caught:
        CompletionRequest(model="m", prompt=[[-1]]).check_token_ids(vocab_size=100)
    assert caught.value.param == "prompt[0][0]"


def test_logit_bias_token_beyond_the_vocabulary_is_a_400_naming_logit_bias() -> None:
    request = parse_completion_request(body(logit_bias={"49152": 1}))
    with pytest.raises(APIError) as caught:
        request.check_token_ids(vocab_size=49152)
    assert (caught.value.status, caught.value.param) == (400, "logit_bias")
    assert "49152" in caught.value.message


def test_a_max_tokens_too_long_to_print_is_still_a_context_length_400() -> None:
    request = parse_completion_request(body(max_tokens=int("9" * 4300)))  # json's largest integer
    with pytest.raises(APIError) as caught:
        request.check_context_length(prompt_tokens=1, context_length=2048)
    assert (caught.value.status, caught.value.code) == (400, "context_length_exceeded")
    assert "bit number of tokens" in caught.value.message


def test_prompt_plus_max_tokens_beyond_the_context_is_a_400_like_openai() -> None:
    request = parse_completion_request(body(max_tokens=100))
    request.check_context_length(prompt_tokens=1948, context_length=2048)
    with pytest.raises(APIError) as caught:
        request.check_context_length(prompt_tokens=1949, context_length=2048)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, "max_tokens", "context_length_exceeded")
    assert caught.value.message.startswith(
        "This model's maximum context length is 2048 tokens, however you requested 2049 tokens "
        "(1949 in your prompt; 100 for the completion)."
    )


def test_prompt_alone_beyond_the_context_names_the_prompt() -> None:
    with pytest.raises(APIError) as caught:
        parse_completion_request(body()).check_context_length(prompt_tokens=3000, context_length=2048)
    assert caught.value.param == "prompt"


def test_more_prompts_than_allowed_is_a_400_naming_prompt(settings) -> None:
    settings.API_MAX_PROMPTS = 3
    with pytest.raises(APIError) as raised:
        parse_completion_request(body(prompt=["a", "b", "c", "d"]))
    assert (raised.value.status, raised.value.param, raised.value.code) == (400, "prompt", "array_above_max_length")
    assert "maximum length 3, but got an array with length 4" in raised.value.message
    assert parse_completion_request(body(prompt=["a", "b", "c"])).prompts == ["a", "b", "c"]


def test_a_logit_bias_key_too_long_to_be_a_token_id_is_a_400() -> None:
    with pytest.raises(APIError) as raised:
        parse_completion_request(body(logit_bias={"9" * 5000: 1}))
    assert raised.value.status == 400 and raised.value.param == "logit_bias"
    assert len(raised.value.message) < 400
