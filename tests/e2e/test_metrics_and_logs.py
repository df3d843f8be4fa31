"""End to end on a real daphne server: /metrics moves by what was served, one access line per request,
no secret in the server's output, and the small faults of issue 15 (429's phrase, HEAD, WebSocket).

A few small requests (``max_tokens`` 1 to 3); the counters are read before and after, so the
session's other tests may run before this module.
"""

from __future__ import annotations

import re
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testing.live_server import MODEL, start_server, stop_server
from testing.sse_client import stream
from tests.completion_helpers import NO_EOS

SECRET = "e2eSecretThatMustNeverBeLogged"
FAKE_KEY = f"sk-cs-AbCd1234.{SECRET}"
REQUEST_ID = "e2e-request.id_1"


def scrape(server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``GET /metrics`` (from the loopback, allowed by default) by name and labels."""
    response = httpx.get(server.base_url + "/metrics", timeout=30)
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def log_lines(server, needle: str, wait: float = 5.0) -> list[str]:
    """The server's output lines containing ``needle``, waiting up to ``wait`` s for one."""
    deadline = time.monotonic() + wait
    while True:
        lines = [line for line in server.log.read_text(errors="replace").splitlines() if needle in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of this module's own at LOG_LEVEL=DEBUG: daphne's access line (which writes the
    query string) is at DEBUG, and the secret tests must see it written, redacted."""
    live = start_server(tmp_path_factory.mktemp("logs"), LOG_LEVEL="DEBUG")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def traffic(server):
    """Send the module's requests once, between two scrapes; returns what the tests check."""
    rpm_key = server.manage("create_api_key", "--name", "rpm1", "--user", "e2e", "--rpm", "1").strip().splitlines()[-1]
    before = scrape(server)
    answered = server.post(
        {
            "model": MODEL,
            "prompt": "Hello there",
            "max_tokens": 3,
            "temperature": 0,
            "logit_bias": NO_EOS,
            "user": f"pasted {FAKE_KEY}",
        },
        headers={"X-Request-ID": REQUEST_ID},
    )
    _, events = stream(
        server,
        {
            "model": MODEL,
            "prompt": "Once upon",
            "max_tokens": 2,
            "temperature": 0,
            "logit_bias": NO_EOS,
            "stream_options": {"include_usage": True},
        },
    )
    in_query = httpx.post(server.api_url + f"/completions?api_key={FAKE_KEY}&n=1", json={"model": MODEL, "prompt": "x"})
    model_is_a_key = server.post({"model": FAKE_KEY, "prompt": "x", "max_tokens": 1})
    models_401 = httpx.get(server.api_url + "/models", headers={"X-Request-ID": "bad id with spaces"})
    first = server.post(
        {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "temperature": 0, "logit_bias": NO_EOS}, key=rpm_key
    )
    limited = server.post({"model": MODEL, "prompt": "Hi", "max_tokens": 1}, key=rpm_key)
    after = scrape(server)
    return {
        "before": before,
        "after": after,
        "answered": answered,
        "stream_usage": events[-2]["usage"],
        "in_query": in_query,
        "model_is_a_key": model_is_a_key,
        "models_401": models_401,
        "first": first,
        "limited": limited,
    }


def test_the_engine_counters_moved_by_the_tokens_served(traffic):
    before, after = traffic["before"], traffic["after"]
    bodies = [traffic["answered"].json()["usage"], traffic["stream_usage"], traffic["first"].json()["usage"]]
    prompt_tokens = sum(usage["prompt_tokens"] for usage in bodies)

    assert [usage["completion_tokens"] for usage in bodies] == [3, 2, 1]
    model = {"model_name": MODEL}  # vLLM's label: the model whose engine counted
    assert delta(before, after, "completions_prompt_tokens_total", **model) == prompt_tokens
    assert delta(before, after, "completions_generation_tokens_total", **model) == 6
    assert delta(before, after, "completions_request_success_total", finish_reason="length", **model) == 3
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert delta(before, after, f"completions_{histogram}_count", **model) == 3, histogram
    assert delta(before, after, "completions_time_per_output_token_seconds_count", **model) == 2  # 1 token has no gap
    assert delta(before, after, "completions_decode_step_duration_seconds_count", **model) >= 3
    assert after[("completions_num_requests_running", (("model_name", MODEL),))] == 0


def test_the_gateway_counters_moved_by_the_requests_and_refusals(traffic):
    before, after = traffic["before"], traffic["after"]
    completions = {"endpoint": "/v1/completions"}

    assert traffic["limited"].status_code == 429 and traffic["in_query"].status_code == 401
    assert delta(before, after, "completions_http_requests_total", **completions, status_class="2xx") == 3
    four_xx = delta(before, after, "completions_http_requests_total", **completions, status_class="4xx")
    assert four_xx == 3  # the 401, the 429 and the 404 of a key sent as the model
    assert delta(before, after, "completions_http_requests_total", endpoint="/v1/models", status_class="4xx") == 1
    assert delta(before, after, "completions_http_unauthorized_total") == 2
    assert delta(before, after, "completions_rate_limited_total", limit="requests") == 1
    assert delta(before, after, "completions_rate_limited_total", limit="tokens") == 0
    assert delta(before, after, "completions_usage_record_write_failures_total") == 0


def test_a_429_has_the_reason_phrase_too_many_requests(traffic):
    assert traffic["limited"].reason_phrase == "Too Many Requests"


def test_a_well_formed_request_id_is_echoed_and_a_malformed_one_replaced(traffic):
    assert traffic["answered"].headers["x-request-id"] == REQUEST_ID
    assert re.fullmatch(r"req_[0-9a-f]{32}", traffic["models_401"].headers["x-request-id"])


def test_each_request_has_one_access_line_with_its_key_prefix_tokens_and_timing(server, traffic):
    answered = traffic["answered"].json()
    lines = log_lines(server, f"request_id={REQUEST_ID}")

    assert len(lines) == 1
    line = lines[0]
    assert "completions.access: POST /v1/completions 200 " in line
    assert f"key_prefix={server.key[6:14]} " in line and "owner=e2e" in line
    assert f"completion_id={answered['id']}" in line and f"model={MODEL}" in line
    assert f"prompt_tokens={answered['usage']['prompt_tokens']} completion_tokens=3" in line
    assert re.search(r" latency_ms=[\d.]+ ttft_ms=[\d.]+$", line)
    assert server.key[15:] not in server.log.read_text()  # the secret of the working key, never


def test_a_4xx_is_logged_once(server, traffic):
    request_id = traffic["models_401"].headers["x-request-id"]

    assert len(log_lines(server, request_id)) == 1
    assert not log_lines(server, "Unauthorized: /v1/models", wait=0)


def test_a_key_in_the_query_string_or_the_user_field_never_reaches_the_log_or_the_record(server, traffic):
    output = server.log.read_text(errors="replace")

    assert SECRET not in output
    request_id = traffic["in_query"].headers["x-request-id"]
    assert log_lines(server, f"POST /v1/completions 401 request_id={request_id}")  # logged, without its query
    record = server.usage(traffic["answered"].json()["id"])
    assert record["user"] == "pasted sk-cs-AbCd1234.***"
    # daphne's own access line, query string and all, is written (at DEBUG), redacted
    assert log_lines(server, "daphne.access", wait=0)
    assert log_lines(server, '"POST /v1/completions?api_key=***&n=1', wait=0)


def test_a_key_sent_as_the_model_never_reaches_the_usage_record_or_the_log(server, traffic):
    answer = traffic["model_is_a_key"]

    assert answer.status_code == 404
    assert server.usage(answer.headers["x-request-id"])["model"] == ""
    assert SECRET not in server.log.read_text(errors="replace")


def test_head_is_get_without_a_body(server):
    get = httpx.get(server.api_url + "/models", headers=server.headers())
    head = httpx.head(server.api_url + "/models", headers=server.headers())

    assert head.status_code == get.status_code == 200
    assert head.content == b"" and head.headers["content-type"] == "application/json"


def test_a_websocket_to_an_unknown_path_is_refused_quietly(server):
    url = urlsplit(server.base_url)
    handshake = (
        f"GET /ws/no-such-path/ HTTP/1.1\r\nHost: {url.netloc}\r\nOrigin: {server.base_url}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(handshake)
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]

    assert status_line.startswith(b"HTTP/1.1 403")
    assert log_lines(server, "WSREJECT /ws/no-such-path/")
    output = server.log.read_text(errors="replace")
    assert "No route found" not in output and "Traceback" not in output
