"""A body over ``API_MAX_BODY_BYTES`` (4 MiB by default) is a 413 JSON error; one at the limit is served.

Checked on the default server at its real limit, and on a second server started with a 2 KiB limit
(where a body sent in chunks, without ``Content-Length``, is measured too).
"""

from __future__ import annotations

import json

import httpx
import pytest

from testing.live_server import MODEL, start_server, stop_server

DEFAULT_LIMIT = 4 * 1024 * 1024
SMALL_LIMIT = 2048


def padded(size: int, **fields) -> bytes:
    """A valid request padded with JSON whitespace to exactly ``size`` bytes."""
    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 1, **fields}).encode()
    assert len(body) <= size
    return body[:-1] + b" " * (size - len(body)) + b"}"


def assert_too_large(response: httpx.Response, limit: int) -> None:
    assert response.status_code == 413, response.text[:500]
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {
        "error": {
            "message": f"The request body is too large: the limit is {limit} bytes.",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    live = start_server(tmp_path_factory.mktemp("small-body"), API_MAX_BODY_BYTES=str(SMALL_LIMIT))
    yield live
    stop_server(live)


def test_a_body_one_byte_over_the_default_limit_is_a_413(server):
    assert_too_large(server.post(padded(DEFAULT_LIMIT + 1)), DEFAULT_LIMIT)


@pytest.mark.parametrize("stream", [False, True])
def test_a_large_but_legal_body_at_the_default_limit_is_served(server, stream):
    response = server.post(padded(DEFAULT_LIMIT, stream=stream))
    assert response.status_code == 200, response.text[:500]
    assert response.text.endswith("data: [DONE]\n\n") if stream else response.json()["choices"]


def test_a_body_over_the_limit_is_refused_whatever_it_holds(server):
    for junk in (b"x" * (DEFAULT_LIMIT + 1), b"[" * (DEFAULT_LIMIT + 1), padded(DEFAULT_LIMIT + 100, stream=True)):
        assert_too_large(server.post(junk), DEFAULT_LIMIT)
    assert server.post({"model": MODEL, "prompt": "Hi", "max_tokens": 1}).status_code == 200


def test_a_smaller_configured_limit_is_the_one_enforced(small_server):
    assert small_server.post(padded(SMALL_LIMIT)).status_code == 200
    assert_too_large(small_server.post(padded(SMALL_LIMIT + 1)), SMALL_LIMIT)


def test_a_body_sent_in_chunks_without_a_length_is_measured_too(small_server):
    body = padded(SMALL_LIMIT + 1)
    pieces = (body[i : i + 512] for i in range(0, len(body), 512))
    response = httpx.post(
        small_server.api_url + "/completions",
        content=pieces,
        timeout=60,
        headers={**small_server.headers(), "Content-Type": "application/json"},
    )
    assert "content-length" not in response.request.headers
    assert_too_large(response, SMALL_LIMIT)
