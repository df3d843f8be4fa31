"""End to end in the deterministic mode (float32 activations and weights, where batching changes no
greedy token): a constrained request in the batch changes only itself."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from testing.live_server import MODEL, start_server, stop_server

LONG = 600  # seconds: the machine is shared
PLAIN = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["name", "year"],
}


@pytest.fixture(scope="module")
def float32_server(tmp_path_factory):
    live = start_server(tmp_path_factory.mktemp("fp32-structured"), MODEL_DTYPE="float32", MODEL_WEIGHTS="float32")
    yield live
    stop_server(live)


def plain(server, prompt: str) -> str:
    response = server.post({"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0}, timeout=LONG)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def constrained(server) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "A famous scientist as JSON."}],
        "max_completion_tokens": 40,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
    }
    response = httpx.post(float32_url(server), json=body, headers=server.headers(), timeout=LONG)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def float32_url(server) -> str:
    return server.api_url + "/chat/completions"


def test_plain_requests_beside_a_constrained_one_get_their_text_alone(float32_server):
    alone = [plain(float32_server, prompt) for prompt in PLAIN]
    constrained_alone = constrained(float32_server)

    with ThreadPoolExecutor(len(PLAIN) + 1) as pool:
        structured = pool.submit(constrained, float32_server)
        together = list(pool.map(lambda prompt: plain(float32_server, prompt), PLAIN))

    assert together == alone
    assert structured.result() == constrained_alone
