"""Calling the Administration API in tests: Django's test client with a Bearer key, JSON in and out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.test import Client

BASE = "/v1/organization"


@dataclass
class Answer:
    """What a client saw: status, headers and the JSON body."""

    status: int
    headers: dict[str, str]
    body: Any

    @property
    def error(self) -> dict:
        assert isinstance(self.body, dict) and "error" in self.body, self.body
        return self.body["error"]


def call(method: str, path: str, key: str | None = None, body: Any = None, **query: Any) -> Answer:
    """``method BASE+path`` with ``Authorization: Bearer key`` (none when ``key`` is None)."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    client = Client()
    url = BASE + path
    if method == "GET":
        response = client.get(url, query, headers=headers)
    else:
        data = "" if body is None else json.dumps(body)
        response = client.generic(method, url, data, content_type="application/json", headers=headers)
    return Answer(
        response.status_code,
        {name.lower(): value for name, value in response.items()},
        json.loads(response.content) if response.content else None,
    )


def get(path: str, key: str | None, **query: Any) -> Answer:
    return call("GET", path, key, **query)


def post(path: str, key: str | None, body: Any = None) -> Answer:
    return call("POST", path, key, body)


def delete(path: str, key: str | None) -> Answer:
    return call("DELETE", path, key)
