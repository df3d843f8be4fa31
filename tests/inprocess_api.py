"""Calling the real API views in the test process, served by the tiny random model.

The views run as under daphne (Django's async request handling, the real URLconf), but the
engine is :func:`testing.tiny_engine.start_tiny_engine`'s, so a request takes milliseconds.  The
tiny tokenizer has one token per character, so ``"Hello"`` is 5 prompt tokens, and
``logit_bias={"0": -100}`` (:data:`NO_EOS`) makes every request generate exactly ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from django.test import AsyncClient

MODEL = "tiny"
NO_EOS = {"0": -100}  # <eos> is id 0 in the tiny vocabulary
# The second model of ``two_models`` (tests/conftest.py): a tiny Qwen3 GGUF, and its alias.
SECOND_MODEL, SECOND_ALIAS = "tiny-qwen3", "qwen-latest"


@dataclass
class Reply:
    """What a client saw: status, headers, the JSON body or the stream's events."""

    status: int
    headers: dict[str, str]
    body: dict | None = None
    events: list[Any] = field(default_factory=list)

    @property
    def error(self) -> dict:
        assert self.body is not None and "error" in self.body, self.body
        return self.body["error"]

    @property
    def request_id(self) -> str:
        return self.headers["x-request-id"]


def body(**fields: Any) -> dict[str, Any]:
    """A request for the tiny model: a 5-token prompt and 4 tokens, with ``fields`` added."""
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "logit_bias": NO_EOS, **fields}


def greedy(model: str, prompt: str = "Hello", max_tokens: int = 6) -> dict[str, Any]:
    """A greedy request for ``model`` (the tiny one or :data:`SECOND_MODEL`, by id or alias) that
    makes exactly ``max_tokens`` tokens: the model's stop tokens are kept from being sampled."""
    if model in (SECOND_MODEL, SECOND_ALIAS):
        from testing.tiny_families import no_stop_bias

        bias = no_stop_bias("qwen3")
    else:
        bias = NO_EOS
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logit_bias": bias}


async def apost(key: str, request: dict[str, Any], path: str = "/v1/completions") -> Reply:
    """``POST path`` (``/v1/completions`` unless told) with Bearer ``key``; a stream is read to its end."""
    response = await AsyncClient().post(
        path,
        data=json.dumps(request),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    headers = {name.lower(): value for name, value in response.items()}
    if not response.streaming:
        return Reply(response.status_code, headers, json.loads(response.content))
    raw = b"".join([chunk async for chunk in response.streaming_content]).decode()
    events = [
        line[len("data: ") :] if line == "data: [DONE]" else json.loads(line[len("data: ") :])
        for line in raw.split("\n")
        if line.startswith("data: ")
    ]
    return Reply(response.status_code, headers, events=events)


def open_stream(key: str, request: dict[str, Any]):
    """``POST /v1/completions`` with ``stream`` set, its body left for the caller to read (or leave)."""
    return AsyncClient().post(
        "/v1/completions",
        data=json.dumps({**request, "stream": True}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def tokens_in(raw: list[bytes]) -> int:
    """The completion tokens a client was sent in these SSE chunks (``logprobs`` lists one entry a token)."""
    sent = 0
    for line in b"".join(raw).decode().split("\n"):
        if line.startswith("data: {"):
            for choice in json.loads(line[len("data: ") :]).get("choices", []):
                sent += len((choice.get("logprobs") or {}).get("tokens") or [])
    return sent


def post(key: str, request: dict[str, Any], path: str = "/v1/completions") -> Reply:
    return async_to_sync(apost)(key, request, path)


def post_many(key: str, requests: list[dict[str, Any]]) -> list[Reply]:
    """Send every request at once (one event loop, as one server would receive them)."""

    async def all_at_once() -> list[Reply]:
        return await asyncio.gather(*(apost(key, request) for request in requests))

    return async_to_sync(all_at_once)()


async def aget(key: str, path: str) -> Reply:
    response = await AsyncClient().get(path, headers={"Authorization": f"Bearer {key}"})
    return Reply(response.status_code, {n.lower(): v for n, v in response.items()}, json.loads(response.content))


def get(key: str, path: str) -> Reply:
    return async_to_sync(aget)(key, path)
