"""No body, however malformed, odd or big, gets a 5xx, a dropped connection or a stuck engine.

Each one is answered with a 4xx ``ErrorResponse`` (OpenAI's shape, every key present), quickly;
afterwards the engine has nothing left running and serves the next request.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from testing.live_server import MODEL


def _with(raw_value: bytes, field: str = "prompt") -> bytes:
    """A valid request whose ``field`` is the raw JSON ``raw_value``."""
    head = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    head.pop(field, None)
    return json.dumps(head).encode()[:-1] + b', "' + field.encode() + b'": ' + raw_value + b"}"


BODIES: dict[str, bytes] = {
    "empty": b"",
    "whitespace": b"   \n",
    "null": b"null",
    "number": b"42",
    "string": b'"prompt"',
    "array": b"[]",
    "truncated": b'{"model": "' + MODEL.encode() + b'", "prompt": "x',
    "trailing_garbage": b'{"model": "' + MODEL.encode() + b'", "prompt": "x"} trailing',
    "invalid_utf8": b'{"model": "' + MODEL.encode() + b'", "prompt": "\xff\xfe"}',
    "lone_surrogate": _with(b'"\\ud800"'),
    "nan": _with(b"NaN", "temperature"),
    "infinity": _with(b"Infinity", "top_p"),
    "huge_exponent": _with(b"1e400", "temperature"),
    "huge_integer": _with(b"9" * 4000, "max_tokens"),
    "too_many_digits": _with(b"9" * 5000, "seed"),
    "negative_huge_seed": _with(b"-" + b"9" * 300, "seed"),
    "deep_array": _with(b"[" * 5000 + b"]" * 5000),
    "deep_object_in_user": _with(b'{"a":' * 5000 + b"1" + b"}" * 5000, "user"),
    "almost_too_deep": _with(b"[" * 900 + b"1" + b"]" * 900),
    "deep_stop": _with(b"[" * 900 + b'"a"' + b"]" * 900, "stop"),
    "deep_logit_bias": _with(b'{"1":' * 900 + b"1" + b"}" * 900, "logit_bias"),
    "many_stop_strings": _with(json.dumps(["a"] * 200_000).encode(), "stop"),
    "many_prompts": _with(json.dumps(["a"] * 300_000).encode()),
    "many_token_ids": _with(json.dumps(list(range(1000)) * 400).encode()),
    "long_prompt": _with(json.dumps("hello " * 500_000).encode()),
    "max_tokens_beyond_context": _with(b"1000000000", "max_tokens"),
    "many_unknown_fields": json.dumps({"model": MODEL, "prompt": "x", **{f"f{i}": i for i in range(50_000)}}).encode(),
    "null_model": b'{"model": null, "prompt": "x"}',
    "model_as_list": b'{"model": ["' + MODEL.encode() + b'"], "prompt": "x"}',
    "duplicate_keys": b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "n": 1, "n": 0}',
    "nul_bytes": b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "user": "\\u0000"}' + b"\x00",
}


@pytest.mark.parametrize("name", list(BODIES))
def test_a_malformed_body_gets_a_4xx_error_response(server, name):
    started = time.monotonic()
    response = server.post(BODIES[name], timeout=60)
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert len(error["message"]) < 1000  # what the client sent is not echoed back whole
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=utf-8"]
)
def test_the_content_type_does_not_matter_to_the_json_body(server, content_type):
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    response = server.post(body, headers={"Content-Type": content_type})
    assert response.status_code == 200, response.text


def test_a_body_in_utf16_is_read_as_json_too(server):
    """Python's JSON reader detects UTF-16 and UTF-32 (RFC 4627), so such a body is served."""
    response = server.post(json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode("utf-16"))
    assert response.status_code == 200, response.text


def test_a_json_body_labelled_multipart_is_a_400_from_the_http_layer(server):
    """Twisted (under daphne) parses a multipart/form-data body itself and answers one that is not
    multipart with a bare 400 before Django sees it: a 4xx, never a 5xx, but not OpenAI's shape."""
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    response = server.post(body, headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert response.status_code == 400
    assert server.post({"model": MODEL, "prompt": "x", "max_tokens": 1}).status_code == 200


def test_after_all_of_them_the_engine_is_idle_and_serves(server):
    for body in BODIES.values():
        server.post(body, timeout=60)
    health = httpx.get(server.base_url + "/healthz").json()
    assert health["running"] == 0 and health["waiting"] == 0
    response = server.post({"model": MODEL, "prompt": "Hello", "max_tokens": 2})
    assert response.status_code == 200
    assert server.alive()
