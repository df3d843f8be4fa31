"""The status an access line and the request metrics count when no answer was sent."""

from __future__ import annotations

import asyncio

import pytest

from api import access


async def _receive() -> dict:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message: dict) -> None:
    pass


def served(app, monkeypatch, raised: type[BaseException]) -> list[int]:
    counted: list[int] = []
    monkeypatch.setattr(access.metrics, "count_request", lambda path, status, seconds: counted.append(status))
    monkeypatch.setattr(access, "_log", lambda *args: None)
    scope = {"type": "http", "path": "/v1/models", "method": "GET", "headers": []}
    with pytest.raises(raised):
        asyncio.run(access.AccessLog(app)(scope, _receive, _send))
    return counted


def test_a_client_that_left_before_the_answer_is_counted_as_499(monkeypatch):
    async def app(scope, receive, send):
        raise asyncio.CancelledError

    assert served(app, monkeypatch, asyncio.CancelledError) == [499]


def test_an_application_that_failed_before_answering_is_counted_as_500(monkeypatch):
    async def app(scope, receive, send):
        raise RuntimeError("a bug")

    assert served(app, monkeypatch, RuntimeError) == [500]
