"""HEAD is GET without the body (RFC 9110): the API's GET routes answer it with GET's status and headers."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/tiny", "/v1/usage/completions?start_time=0"])
def test_head_answers_as_get_does_without_a_body(tiny_api, valid_key, path):
    client = Client(headers={"Authorization": f"Bearer {valid_key.plaintext}"})

    get, head = client.get(path), client.head(path)

    assert head.status_code == get.status_code == 200
    assert head["Content-Type"] == get["Content-Type"] == "application/json"
    assert head.content == b""


def test_head_without_a_key_is_the_same_401(tiny_api):
    assert Client().head("/v1/models").status_code == 401


def test_a_405_lists_head_beside_get(tiny_api, valid_key):
    response = Client().post("/v1/models", headers={"Authorization": f"Bearer {valid_key.plaintext}"})

    assert response.status_code == 405 and response["Allow"] == "GET, HEAD, OPTIONS"
