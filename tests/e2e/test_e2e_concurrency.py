"""End to end: several clients at once each get complete answers; a slow reader stalls nobody."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from testing.live_server import MODEL

PROMPTS = [
    "The capital of France is",
    "def add(a, b):",
    "Once upon a time",
    "My favourite food is",
    "The sky is blue because",
    "Water boils at",
]


def test_concurrent_clients_each_get_a_complete_answer(openai_client):
    def ask(prompt: str):
        return openai_client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logit_bias={"2": -100}
        )

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(ask, PROMPTS))
    assert len({r.id for r in results}) == len(PROMPTS)
    for result in results:
        assert result.choices[0].finish_reason == "length"
        assert result.usage.completion_tokens == 12
        assert result.choices[0].text


def test_concurrent_streams_each_end_with_done(server):
    def stream_one(prompt: str) -> list[str]:
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 10,
            "stream": True,
            "logit_bias": {"2": -100},
            "stream_options": {"include_usage": True},
        }
        with httpx.stream(
            "POST", server.api_url + "/completions", json=body, headers=server.headers(), timeout=120
        ) as r:
            return [line for line in r.iter_lines() if line.startswith("data: ")]

    with ThreadPoolExecutor(4) as pool:
        streams = list(pool.map(stream_one, PROMPTS[:4]))
    for lines in streams:
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == 10
        # One chunk per token, except that a token ending inside a UTF-8 character waits for the next.
        text_chunks = chunks[:-1]
        assert 1 <= len(text_chunks) <= 10
        assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_client_that_does_not_read_does_not_stall_the_others(server):
    slow_body = {
        "model": MODEL,
        "prompt": "Tell me everything.",
        "max_tokens": 300,
        "stream": True,
        "logit_bias": {"2": -100},
    }
    with httpx.Client(timeout=120) as slow_client:
        with slow_client.stream(
            "POST", server.api_url + "/completions", json=slow_body, headers=server.headers()
        ) as slow:
            assert slow.status_code == 200  # opened, and never read while the others run
            quick = [server.post({"model": MODEL, "prompt": p, "max_tokens": 5}, timeout=60) for p in PROMPTS[:3]]
            assert all(r.status_code == 200 for r in quick)
            assert all(r.json()["choices"][0]["finish_reason"] in ("stop", "length") for r in quick)
