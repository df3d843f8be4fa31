"""End to end: one usage record per request, streamed, failed and interrupted ones too."""

from __future__ import annotations

import json
import signal
import time

import httpx

from testing.live_server import MODEL, start_server, stop_server
from testing.sse_client import stream
from tests.completion_helpers import NO_EOS

PROMPT = "Write a long story about a dragon."


def test_a_completion_leaves_a_record_with_its_usage(server):
    response = server.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "logit_bias": NO_EOS, "user": "u1"})
    body = response.json()
    record = server.usage(body["id"])
    assert response.headers["x-request-id"] == body["id"]
    assert record["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert record["completion_tokens"] == 5
    assert record["total_tokens"] == body["usage"]["total_tokens"]
    assert record["status_code"] == 200 and record["stream"] == 0
    assert record["finish_reason"] == "length"
    assert record["model"] == MODEL and record["user"] == "u1"
    assert record["latency_ms"] > 0 and record["time_to_first_token_ms"] <= record["latency_ms"]
    assert record["api_key_id"] is not None and record["owner_id"] is not None


def test_a_stream_leaves_a_record_equal_to_its_usage_chunk(server):
    _, events = stream(
        server,
        {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 7,
            "logit_bias": NO_EOS,
            "stream_options": {"include_usage": True},
        },
    )
    usage = events[-2]["usage"]
    record = server.usage(events[-2]["id"])
    assert record["stream"] == 1 and record["status_code"] == 200
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


def test_a_rejected_request_leaves_a_record_with_its_status(server):
    response = server.post({"model": MODEL, "prompt": PROMPT, "temperature": 9})
    record = server.usage(response.headers["x-request-id"])
    assert record["status_code"] == 400
    assert record["error_type"] == "invalid_request_error"
    assert record["completion_tokens"] == 0


def test_an_unauthenticated_request_leaves_no_record(server):
    before = server.usage_count()
    httpx.post(server.api_url + "/completions", json={"model": MODEL, "prompt": "x"})
    assert server.usage_count() == before


def test_a_client_that_disconnects_mid_stream_leaves_a_record_of_the_tokens_so_far(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400, "logit_bias": NO_EOS, "stream": True}
    with httpx.stream(
        "POST", server.api_url + "/completions", json=body, headers=server.headers(), timeout=60
    ) as response:
        request_id = response.headers["x-request-id"]
        received = 0
        for line in response.iter_lines():
            if line.startswith("data: "):
                received += 1
                if received == 3:
                    break
    record = server.usage(request_id, wait=30)
    assert record is not None
    assert record["finish_reason"] == "interrupted"
    assert record["stream"] == 1 and record["status_code"] == 200  # what the client was sent
    assert 3 <= record["completion_tokens"] < 400
    # The engine dropped the sequence: nothing is left running.
    deadline = time.monotonic() + 10
    while httpx.get(server.base_url + "/healthz").json()["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(server.base_url + "/healthz").json()["running"] == 0


def test_a_client_that_disconnects_before_a_non_streamed_answer_leaves_a_record(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400, "logit_bias": NO_EOS}
    request_id = None
    try:
        server.post(body, timeout=1.5)
    except httpx.ReadTimeout:
        pass
    # The id was never delivered; find the newest record for this key instead.
    import sqlite3

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with sqlite3.connect(server.database) as connection:
            row = connection.execute(
                "SELECT request_id, finish_reason, completion_tokens FROM keys_usagerecord ORDER BY id DESC LIMIT 1"
            ).fetchone()
        if row and row[1] == "interrupted":
            request_id = row[0]
            break
        time.sleep(0.2)
    assert request_id is not None, "no interrupted record was written"
    assert 0 < row[2] < 400


def test_a_stream_cut_by_sigkill_of_its_server_is_recorded_with_the_tokens_it_sent(tmp_path):
    killed = start_server(tmp_path, ENGINE_NUM_THREADS="1")
    successor = None
    try:
        body = {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 400,
            "logit_bias": NO_EOS,
            "stream": True,
            "logprobs": 0,
        }
        with httpx.stream(
            "POST", killed.api_url + "/completions", json=body, headers=killed.headers(), timeout=60
        ) as response:
            request_id, sent = response.headers["x-request-id"], 0
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    sent += sum(
                        len((c.get("logprobs") or {}).get("tokens") or []) for c in json.loads(line[6:])["choices"]
                    )
                    if sent >= 10:
                        break
            killed.process.send_signal(signal.SIGKILL)
            killed.process.wait(timeout=30)
        assert killed.usage(request_id, wait=0) is None  # the process died with its stream running

        successor = start_server(tmp_path, key=killed.key, ENGINE_NUM_THREADS="1")  # replays the journal
        record = successor.usage(request_id, wait=30)
    finally:
        for server in (killed, successor):
            if server is not None and server.alive():
                stop_server(server)

    assert record is not None
    assert (record["status_code"], record["finish_reason"], record["stream"]) == (200, "interrupted", 1)
    assert sent <= record["completion_tokens"] <= 400
