"""End to end: bad input gets OpenAI's error shape before any byte of a stream, and no 5xx."""

from __future__ import annotations

import httpx
import openai
import pytest

from testing.live_server import MODEL


def assert_error(response: httpx.Response, status: int, param=None, code=None, type="invalid_request_error"):
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type
    assert error["param"] == param
    assert error["code"] == code
    return error


@pytest.mark.parametrize("stream", [False, True])
def test_out_of_range_temperature_is_a_400_before_the_stream(server, stream):
    response = server.post({"model": MODEL, "prompt": "x", "temperature": 2.5, "stream": stream})
    error = assert_error(response, 400, param="temperature", code="decimal_above_max_value")
    assert error["message"] == (
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 2.5 instead."
    )


def test_invalid_json_is_a_400(server):
    assert_error(server.post(b"{not json"), 400)


def test_wrong_type_is_a_400_naming_the_param(server):
    response = server.post({"model": MODEL, "prompt": "x", "max_tokens": "ten"})
    error = assert_error(response, 400, param="max_tokens", code="invalid_type")
    assert error["message"] == "Invalid type for 'max_tokens': expected an integer, but got a string instead."


@pytest.mark.parametrize("stream", [False, True])
def test_five_stop_words_get_openais_code_before_the_stream(server, stream):
    response = server.post(
        {
            "model": MODEL,
            "prompt": "One, two, three,",
            "max_tokens": 16,
            "stop": ["\n", "x", "y", "z", "w"],
            "stream": stream,
        }
    )
    error = assert_error(response, 400, param="stop", code="array_above_max_length")
    assert error["message"] == (
        "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length 5 "
        "instead."
    )


def test_missing_prompt_names_it(server):
    error = assert_error(server.post({"model": MODEL}), 400, param="prompt", code="missing_required_parameter")
    assert error["message"] == "Missing required parameter: 'prompt'."


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_that_overflows_the_context_is_a_400_with_the_numbers(server, stream):
    response = server.post({"model": MODEL, "prompt": "hello " * 4000, "max_tokens": 5000, "stream": stream})
    error = assert_error(response, 400, param="max_tokens", code="context_length_exceeded")
    assert "8192" in error["message"] and "5000" in error["message"]


def test_missing_key_is_a_401(server):
    response = httpx.post(server.api_url + "/completions", json={"model": MODEL, "prompt": "x"})
    assert_error(response, 401)


def test_wrong_key_is_a_401_that_never_echoes_the_key(server):
    wrong = "sk-cs-AAAAAAAA.this-is-not-a-real-secret"
    response = server.post({"model": MODEL, "prompt": "x"}, key=wrong)
    assert_error(response, 401, code="invalid_api_key")
    assert "this-is-not" not in response.text and "AAAAAAAA" not in response.text


def test_every_v1_route_requires_a_key(server):
    for path in ("/models", f"/models/{MODEL}"):
        assert httpx.get(server.api_url + path).status_code == 401


def test_openai_client_raises_bad_request_with_the_param(openai_client):
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.completions.create(model=MODEL, prompt="x", top_p=1.5)
    assert raised.value.body["param"] == "top_p"


def test_server_stays_healthy_after_bad_input(server):
    for body in (
        b"",
        b"[]",
        b"null",
        b'{"model": 1}',
        b"\xff\xfe",
        b'{"model": "' + MODEL.encode() + b'", "prompt": [[-1]]}',
    ):
        assert 400 <= server.post(body).status_code < 500
    assert server.post({"model": MODEL, "prompt": "Hello", "max_tokens": 2}).status_code == 200
    assert server.alive()


def test_suffix_on_a_model_without_fill_in_the_middle_tokens_is_a_400_that_says_why(server):
    response = server.post({"model": MODEL, "prompt": "def f(", "suffix": "return x"})
    error = assert_error(response, 400, param="suffix", code="unsupported_parameter")
    assert "fill-in-the-middle" in error["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/completions"), ("PUT", "/completions"), ("DELETE", "/completions"), ("POST", "/models")],
)
def test_a_wrong_method_is_a_json_405(server, method, path):
    response = httpx.request(method, server.api_url + path, headers=server.headers(), json={})
    assert_error(response, 405)
    assert response.headers["allow"]


@pytest.mark.parametrize("path", ["/nope", "/completions/", "/engines/davinci/completions", "/completions\n"])
def test_an_unknown_v1_url_is_a_json_404(server, path):
    response = httpx.post(server.api_url + path.replace("\n", "%0A"), headers=server.headers(), json={})
    error = assert_error(response, 404)
    assert error["message"] == f"Invalid URL (POST /v1{path})"
