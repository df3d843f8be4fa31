"""Reading a raw SSE stream from the live server, as a client without an SDK would."""

from __future__ import annotations

import json

import httpx


def read_events(response: httpx.Response) -> list[dict | str]:
    """Every ``data:`` payload of a streamed response: parsed JSON, or the string ``"[DONE]"``."""
    events: list[dict | str] = []
    for line in response.iter_lines():
        if not line.startswith("data: "):
            assert line == "" or line.startswith(":"), f"unexpected SSE line {line!r}"
            continue
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def stream(server, body: dict, **kwargs) -> tuple[httpx.Response, list[dict | str]]:
    """POST ``body`` with ``stream: true`` and return the response and its events."""
    with httpx.stream(
        "POST",
        server.api_url + "/completions",
        json={**body, "stream": True},
        headers=server.headers(),
        timeout=120,
        **kwargs,
    ) as response:
        if response.status_code != 200:
            response.read()
            return response, []
        return response, read_events(response)


def stream_text(events: list[dict | str], index: int = 0) -> str:
    """The concatenated text of choice ``index`` over a stream's events."""
    return "".join(
        choice["text"]
        for event in events
        if isinstance(event, dict)
        for choice in event.get("choices", [])
        if choice["index"] == index
    )
