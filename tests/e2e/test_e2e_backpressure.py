"""End to end: past the queue limit a request gets an immediate 503 with Retry-After; the server stays healthy."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from testing.live_server import MODEL, start_server, stop_server


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """A server that runs one sequence at a time and queues at most one more request."""
    live = start_server(tmp_path_factory.mktemp("small"), ENGINE_MAX_BATCH_SIZE="1", ENGINE_MAX_QUEUE="1")
    yield live
    stop_server(live)


def _hold(server, ready: threading.Event, stop: threading.Event) -> None:
    """Stream a long completion until told to stop, keeping the engine busy."""
    body = {
        "model": MODEL,
        "prompt": "Count to a thousand:",
        "max_tokens": 2000,
        "stream": True,
        "logit_bias": {"2": -100},
    }
    with httpx.stream("POST", server.api_url + "/completions", json=body, headers=server.headers(), timeout=120) as r:
        for _ in r.iter_lines():
            ready.set()
            if stop.is_set():
                return


def test_past_the_queue_limit_a_request_gets_503_with_retry_after(small_server):
    stop = threading.Event()
    running, queued = threading.Event(), threading.Event()
    holders = [threading.Thread(target=_hold, args=(small_server, running, stop))]
    holders[0].start()
    try:
        assert running.wait(60)
        # A client holding its first token finds its request running, no longer waiting.
        assert httpx.get(small_server.base_url + "/healthz").json()["waiting"] == 0
        # The second request waits in the queue (the batch holds one sequence).
        holders.append(threading.Thread(target=_hold, args=(small_server, queued, stop)))
        holders[1].start()
        deadline = time.monotonic() + 30
        while httpx.get(small_server.base_url + "/healthz").json()["waiting"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        response = small_server.post({"model": MODEL, "prompt": "Hi", "max_tokens": 1}, timeout=10)
        assert response.status_code == 503
        assert response.headers["retry-after"]
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert "overloaded" in error["message"]
    finally:
        stop.set()
        for holder in holders:
            holder.join(60)
    health = httpx.get(small_server.base_url + "/healthz")
    assert health.status_code == 200
    ok = small_server.post({"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200
