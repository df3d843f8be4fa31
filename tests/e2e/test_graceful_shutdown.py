"""SIGTERM drains a real daphne process: it stops admitting, lets short streams finish, ends the
long ones with one in-band error after ``SHUTDOWN_GRACE_SECONDS``, writes every usage record,
frees its concurrency slots and exits 0.  A second SIGTERM ends the rest at once; SIGINT (Ctrl-C)
does the same.

Each test starts a server of its own (it is stopped by the test), with a short grace period.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from testing.live_server import MODEL, LiveServer, start_server, stop_server
from tests.conftest import TEST_REDIS_URL, redis_reachable

NO_EOS = {"0": -100, "2": -100}  # neither end-of-text token: a request makes exactly max_tokens
GRACE = 3


class Stream(threading.Thread):
    """A streamed request read in a thread: its request id, events, and when its first event came."""

    def __init__(self, server: LiveServer, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.server, self.max_tokens = server, max_tokens
        self.first_event = threading.Event()
        self.events: list[dict | str] = []
        self.request_id = ""
        self.status = 0

    def run(self) -> None:
        body = {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": self.max_tokens,
            "stream": True,
            "logit_bias": NO_EOS,
        }
        with httpx.stream(
            "POST", self.server.api_url + "/completions", json=body, headers=self.server.headers(), timeout=60
        ) as response:
            self.status, self.request_id = response.status_code, response.headers.get("x-request-id", "")
            for line in response.iter_lines():
                if line.startswith("data: "):
                    payload = line[len("data: ") :]
                    self.events.append(payload if payload == "[DONE]" else json.loads(payload))
                    self.first_event.set()
        self.first_event.set()


@pytest.fixture
def draining_server(tmp_path):
    settings = {"SHUTDOWN_GRACE_SECONDS": str(GRACE), "ENGINE_NUM_THREADS": "1"}
    server = start_server(tmp_path, **settings)
    yield server
    if server.alive():
        stop_server(server)


def _key_with_concurrency_limit(server: LiveServer) -> str:
    return (
        server.manage("create_api_key", "--name", "drain", "--user", "e2e", "--max-concurrent", "8")
        .strip()
        .splitlines()[-1]
    )


def _in_flight_slots(server: LiveServer) -> int:
    """The concurrency slots held in Redis under the server's prefix (0 without Redis)."""
    if not server.env.get("REDIS_URL"):
        return 0
    import redis

    client = redis.Redis.from_url(server.env["REDIS_URL"])
    return sum(
        client.zcard(key) for key in client.scan_iter(match=server.env["API_LIMITS_REDIS_PREFIX"] + "*:in-flight")
    )


def test_sigterm_drains_short_streams_ends_long_ones_in_band_records_all_and_exits_0(draining_server):
    server = draining_server
    server.key = _key_with_concurrency_limit(server)
    short = [Stream(server, 12) for _ in range(2)]
    long = [Stream(server, 4000) for _ in range(2)]
    for stream in short + long:
        stream.start()
    for stream in short + long:
        assert stream.first_event.wait(60)
    plain: dict[str, httpx.Response] = {}
    waiting = threading.Thread(
        target=lambda: plain.update(
            response=server.post(
                {"model": MODEL, "prompt": "Hello", "max_tokens": 4000, "logit_bias": NO_EOS}, timeout=60
            )
        )
    )
    waiting.start()
    time.sleep(0.5)  # admitted before the signal
    if server.env.get("REDIS_URL") and redis_reachable(TEST_REDIS_URL):
        assert _in_flight_slots(server) >= 2  # the long streams hold theirs

    server.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    health = _wait_for_health(server, "draining")
    assert health.status_code == 503 and health.json()["open_requests"] >= 3  # the long ones at least
    refused = server.post({"model": MODEL, "prompt": "Hi", "max_tokens": 1})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "server_error"
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}

    assert server.process.wait(timeout=GRACE + 30) == 0
    assert time.monotonic() - started >= GRACE - 0.5  # the long streams were given the grace period
    for stream in short + long:
        stream.join(10)
        assert stream.status == 200 and stream.events[-1] == "[DONE]"
    for stream in short:
        chunks = [e for e in stream.events if isinstance(e, dict)]
        assert not any("error" in e for e in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    for stream in long:
        errors = [e for e in stream.events if isinstance(e, dict) and "error" in e]
        assert len(errors) == 1 and stream.events[-2] is errors[0]
        assert "shutting down" in errors[0]["error"]["message"]
        assert errors[0]["error"]["code"] == "server_shutting_down"

    waiting.join(10)
    ended = plain["response"]
    assert ended.status_code == 503 and "shutting down" in ended.json()["error"]["message"]
    assert ended.json()["error"]["code"] == "server_shutting_down"
    assert server.usage(ended.headers["x-request-id"], wait=0)["finish_reason"] == "error"

    records = {s.request_id: server.usage(s.request_id, wait=0) for s in short + long}
    assert all(records.values()), records
    assert {records[s.request_id]["finish_reason"] for s in short} == {"length"}
    assert {records[s.request_id]["finish_reason"] for s in long} == {"error"}
    assert all(records[s.request_id]["completion_tokens"] > 0 for s in long)
    assert _in_flight_slots(server) == 0
    log = server.log.read_text()
    assert "Could not record usage" not in log and "still being written" not in log, log[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_second_signal_ends_running_streams_at_once_and_still_records_them(tmp_path, signum):
    """SIGINT (Ctrl-C) drains as SIGTERM does: the first stops admitting, the second ends the
    streams with an in-band error and ``[DONE]``; the records are written before the exit."""
    # A shell's background job inherits SIGINT ignored, and the server would too (the server keeps
    # an ignored SIGINT ignored); a Python handler here becomes the default in the child.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server = start_server(tmp_path, SHUTDOWN_GRACE_SECONDS="120", ENGINE_NUM_THREADS="1")
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        stream = Stream(server, 4000)
        stream.start()
        assert stream.first_event.wait(60)
        server.process.send_signal(signum)
        _wait_for_health(server, "draining")
        started = time.monotonic()
        server.process.send_signal(signum)
        assert server.process.wait(timeout=30) == 0
        assert time.monotonic() - started < 15
        stream.join(10)
        assert stream.events[-1] == "[DONE]" and "error" in stream.events[-2]
        record = server.usage(stream.request_id, wait=0)
        assert record is not None and record["finish_reason"] == "error"
        log = server.log.read_text()
        assert f"{signum.name}: draining 1 open requests" in log, log[-3000:]
        assert "Could not record usage" not in log and "Traceback" not in log, log[-3000:]
    finally:
        if server.alive():
            server.process.kill()


def _wait_for_health(server: LiveServer, status: str) -> httpx.Response:
    deadline = time.monotonic() + 10
    while True:
        response = httpx.get(server.base_url + "/healthz", timeout=5)
        if response.json().get("status") == status or time.monotonic() > deadline:
            assert response.json()["status"] == status
            return response
        time.sleep(0.05)


pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGTERM is POSIX")
