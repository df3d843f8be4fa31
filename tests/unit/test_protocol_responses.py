"""The response builders of ``api.protocol`` and ``api.completions.protocol`` produce what OpenAI's spec
describes, keys in its order.

Each builder's output is checked against the vendored spec (``tests.openai_schema.validate``); the two
places where OpenAI's real stream departs from its own spec (``finish_reason: null`` mid-stream,
``usage: null`` on every chunk with ``include_usage``) are pinned separately.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from api.completions.protocol import (
    completion_choice,
    completion_chunk,
    completion_response,
    logprobs_dict,
    new_completion_id,
)
from api.errors import APIError
from api.protocol import SCHEMA_PATH, body_too_large_error, model_list, model_not_found_error, model_object, usage_dict
from tests.openai_schema import validate

CREATED = 1_589_478_378
MODEL = "smollm2-135m-instruct"


def test_completion_response_is_a_valid_create_completion_response_in_openai_key_order() -> None:
    choice = completion_choice(0, "\n\nThis is indeed a test", "length")
    response = completion_response("cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7", CREATED, MODEL, [choice], usage_dict(5, 7))
    validate("CreateCompletionResponse", response)
    # OpenAI's documented example, byte for byte apart from the model.
    assert json.dumps(response) == json.dumps(
        {
            "id": "cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7",
            "object": "text_completion",
            "created": CREATED,
            "model": MODEL,
            "choices": [{"text": "\n\nThis is indeed a test", "index": 0, "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        }
    )


def test_usage_totals_prompt_and_completion_tokens() -> None:
    usage = usage_dict(prompt_tokens=5, completion_tokens=7)
    validate("CompletionUsage", usage)
    assert list(usage.items()) == [("prompt_tokens", 5), ("completion_tokens", 7), ("total_tokens", 12)]


@pytest.mark.parametrize("finish_reason", ["stop", "length"])
def test_every_finish_reason_we_send_is_in_the_spec(finish_reason: str) -> None:
    choices = [completion_choice(0, "", finish_reason)]
    response = completion_response("cmpl-x", CREATED, MODEL, choices, usage_dict(1, 0))
    validate("CreateCompletionResponse", response)


def test_choice_with_logprobs_is_valid_and_in_openai_key_order() -> None:
    logprobs = logprobs_dict(
        tokens=[" Hello", " world"],
        token_logprobs=[-0.5, -1.25],
        top_logprobs=[{" Hello": -0.5, " Hi": -1.5}, {" world": -1.25}],
        text_offset=[0, 6],
    )
    assert list(logprobs) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    choice = completion_choice(1, " Hello world", "stop", logprobs)
    assert list(choice) == ["text", "index", "logprobs", "finish_reason"]
    validate("CreateCompletionResponse", completion_response("cmpl-x", CREATED, MODEL, [choice], usage_dict(2, 2)))


def test_echoed_first_token_has_null_logprobs_as_openai_sends_them() -> None:
    logprobs = logprobs_dict(["Say", " this"], [None, -2.0], [None, {" this": -2.0}], [0, 3])
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None


def test_stream_chunks_share_the_response_shape() -> None:
    chunk = completion_chunk("cmpl-x", CREATED, MODEL, [completion_choice(0, " world", "stop")])
    assert list(chunk) == ["id", "object", "created", "model", "choices"]
    assert chunk["object"] == "text_completion"
    validate("CreateCompletionResponse", chunk)


def test_mid_stream_chunk_has_a_null_finish_reason_and_otherwise_fits_the_spec() -> None:
    chunk = completion_chunk("cmpl-x", CREATED, MODEL, [completion_choice(0, " Hel", None)])
    assert chunk["choices"][0]["finish_reason"] is None
    chunk["choices"][0]["finish_reason"] = "stop"  # the spec's enum has no null; OpenAI streams null
    validate("CreateCompletionResponse", chunk)


def test_with_include_usage_every_chunk_has_usage_null_and_the_last_has_the_usage() -> None:
    chunk = completion_chunk("cmpl-x", CREATED, MODEL, [completion_choice(0, "Hi", None)], include_usage=True)
    assert list(chunk) == ["id", "object", "created", "model", "choices", "usage"]
    assert chunk["usage"] is None
    last = completion_chunk("cmpl-x", CREATED, MODEL, [], usage=usage_dict(3, 4), include_usage=True)
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    validate("CreateCompletionResponse", last)


def test_model_object_is_a_valid_model() -> None:
    model = model_object(MODEL, CREATED, "completions-site")
    validate("Model", model)
    assert list(model.items()) == [
        ("id", MODEL),
        ("object", "model"),
        ("created", CREATED),
        ("owned_by", "completions-site"),
    ]


def test_model_list_is_a_valid_list_models_response() -> None:
    listing = model_list([model_object(MODEL, CREATED, "completions-site")])
    validate("ListModelsResponse", listing)
    assert list(listing) == ["object", "data"] and listing["object"] == "list"


def test_empty_model_list_is_valid() -> None:
    validate("ListModelsResponse", model_list([]))


@pytest.mark.parametrize(
    "error",
    [
        APIError("2.5 is greater than the maximum of 2 - 'temperature'", param="temperature"),
        APIError("boom", status=500, type="server_error"),
        body_too_large_error(4 * 1024 * 1024),
        model_not_found_error("gpt-4"),
    ],
    ids=["validation", "server_error", "too_large", "model_not_found"],
)
def test_api_errors_are_valid_error_responses(error: APIError) -> None:
    validate("ErrorResponse", error.to_dict())


def test_model_not_found_is_a_404_like_openai() -> None:
    error = model_not_found_error("gpt-4")
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert error.message == "The model `gpt-4` does not exist or you do not have access to it."


def test_completion_ids_are_cmpl_and_24_url_safe_random_characters() -> None:
    ids = {new_completion_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"cmpl-[A-Za-z0-9_-]{24,}", value) for value in ids)


def test_the_schema_checker_rejects_what_the_spec_rejects() -> None:
    with pytest.raises(AssertionError, match="'object' is a required property"):
        validate("Model", {"id": MODEL, "created": CREATED, "owned_by": "x"})
    with pytest.raises(AssertionError, match="is not one of"):
        response = completion_response("c", 1, MODEL, [], usage_dict(0, 0))
        validate("CreateCompletionResponse", {**response, "object": "list"})


# --- The vendored spec --------------------------------------------------------------------------

SPEC = Path(__file__).resolve().parents[3] / "shared" / "openai-openapi.yaml"


def test_vendored_schema_is_valid_json_schema_2020_12() -> None:
    document = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_vendored_schema_has_no_openapi_only_keywords_left() -> None:
    text = SCHEMA_PATH.read_text(encoding="utf-8")
    assert "#/components/" not in text

    def keywords(schema, inside_properties=False):
        # Keys of a "properties" map are field names (ResponseFormatJsonSchema has one called
        # "description"); every other key is a keyword.
        if isinstance(schema, list):
            for item in schema:
                yield from keywords(item)
        elif isinstance(schema, dict):
            for key, value in schema.items():
                if not inside_properties:
                    yield key
                yield from keywords(value, inside_properties=key == "properties" and not inside_properties)

    found = set(keywords(json.loads(text)["$defs"]))
    assert not found & {"nullable", "description", "example", "examples"}


@pytest.mark.skipif(not SPEC.exists(), reason="OpenAI's spec is not beside the checkout (../shared)")
def test_vendored_schema_is_what_the_tool_makes_from_the_spec(tmp_path: Path) -> None:
    output = tmp_path / "openai_schema.json"
    tool = Path(__file__).resolve().parents[2] / "tools" / "vendor_openai_schema.py"
    subprocess.run([sys.executable, str(tool), str(SPEC), "--output", str(output)], check=True, capture_output=True)
    assert output.read_text(encoding="utf-8") == SCHEMA_PATH.read_text(encoding="utf-8")


def test_a_model_object_carries_its_runner_as_our_extension() -> None:
    runner = {"name": "transformers", "reason": "our runner does not run it: partial rotary embeddings"}
    model = model_object(MODEL, CREATED, "completions-site", runner)
    validate("Model", model)
    assert model["runner"] == runner
    assert "runner" not in model_object(MODEL, CREATED, "completions-site")
