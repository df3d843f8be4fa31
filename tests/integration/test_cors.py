"""Browsers may call the API from the origins in ``API_CORS_ALLOWED_ORIGINS`` (django-cors-headers'
middleware inside the API's handler, ``api/handlers.py``): preflights on every ``/v1`` route,
the allow-headers OpenAI's clients send, readable errors and headers; nothing when none is set."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import Client, RequestFactory

from api.handlers import APIHandler
from tests.inprocess_api import MODEL, NO_EOS, body
from tests.integration.test_chat_completions import TEMPLATE as CHAT_TEMPLATE

pytestmark = pytest.mark.django_db

APP = "https://app.example.com"
OTHER = "https://evil.example.net"
ROUTES = [("/v1/completions", "POST"), ("/v1/chat/completions", "POST"), ("/v1/models", "GET")]
CLIENT_HEADERS = "authorization, content-type, x-stainless-os, x-stainless-lang, openai-organization"


@pytest.fixture
def allowed_origins(settings):
    """What API_CORS_ALLOWED_ORIGINS=https://app.example.com sets."""
    settings.CORS_ALLOWED_ORIGINS = [APP]
    settings.CORS_ALLOW_ALL_ORIGINS = False


def answer(request):
    return async_to_sync(APIHandler().get_response_async)(request)


def preflight(path: str, method: str, origin: str = APP):
    return answer(
        RequestFactory().options(
            path,
            HTTP_ORIGIN=origin,
            HTTP_ACCESS_CONTROL_REQUEST_METHOD=method,
            HTTP_ACCESS_CONTROL_REQUEST_HEADERS=CLIENT_HEADERS,
        )
    )


def cors_headers(response) -> dict[str, str]:
    return {name.lower(): value for name, value in response.items() if name.lower().startswith("access-control-")}


@pytest.mark.parametrize(("path", "method"), ROUTES)
def test_a_preflight_from_an_allowed_origin_is_allowed_with_what_the_clients_send(allowed_origins, path, method):
    response = preflight(path, method)

    assert response.status_code == 200
    assert response["Access-Control-Allow-Origin"] == APP
    assert method in response["Access-Control-Allow-Methods"].split(", ")
    assert set(CLIENT_HEADERS.split(", ")) <= set(response["Access-Control-Allow-Headers"].split(", "))
    assert int(response["Access-Control-Max-Age"]) > 0
    assert "Access-Control-Allow-Credentials" not in response  # keys, not cookies
    assert "origin" in response["Vary"].lower()


@pytest.mark.parametrize(("path", "method"), ROUTES)
def test_a_preflight_from_another_origin_gets_no_allowance(allowed_origins, path, method):
    response = preflight(path, method, origin=OTHER)

    assert response.status_code == 200
    assert cors_headers(response) == {}


@pytest.mark.parametrize(("path", "method"), ROUTES)
def test_without_origins_set_a_preflight_is_answered_without_any_cors_header(path, method):
    response = preflight(path, method)

    assert response.status_code == 200  # not a 405: the browser reports the missing allowance
    assert cors_headers(response) == {}


def test_a_cross_origin_completion_can_read_its_answer_and_headers(allowed_origins, tiny_api, valid_key):
    request = RequestFactory().post(
        "/v1/completions",
        data=json.dumps(body()),
        content_type="application/json",
        HTTP_ORIGIN=APP,
        HTTP_AUTHORIZATION=f"Bearer {valid_key.plaintext}",
    )

    response = answer(request)

    assert response.status_code == 200
    assert response["Access-Control-Allow-Origin"] == APP
    exposed = response["Access-Control-Expose-Headers"].split(", ")
    assert {"x-request-id", "x-ratelimit-remaining-requests", "retry-after"} <= set(exposed)
    assert "x-request-id" in response


def test_a_cross_origin_chat_completion_is_allowed(allowed_origins, tiny_api, valid_key, monkeypatch):
    monkeypatch.setattr(tiny_api.tokenizer, "chat_template", CHAT_TEMPLATE, raising=False)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logit_bias": NO_EOS}
    request = RequestFactory().post(
        "/v1/chat/completions",
        data=json.dumps(chat),
        content_type="application/json",
        HTTP_ORIGIN=APP,
        HTTP_AUTHORIZATION=f"Bearer {valid_key.plaintext}",
    )

    response = answer(request)

    assert response.status_code == 200, response.content
    assert response["Access-Control-Allow-Origin"] == APP


def test_an_error_is_readable_across_origins_too(allowed_origins):
    response = answer(RequestFactory().get("/v1/models", HTTP_ORIGIN=APP))

    assert response.status_code == 401
    assert response["Access-Control-Allow-Origin"] == APP


def test_no_cors_headers_when_no_origin_is_set(valid_key):
    response = answer(
        RequestFactory().get("/v1/models", HTTP_ORIGIN=APP, HTTP_AUTHORIZATION=f"Bearer {valid_key.plaintext}")
    )

    assert response.status_code == 200
    assert cors_headers(response) == {}


def test_any_origin_is_a_star_without_credentials(settings, valid_key):
    settings.CORS_ALLOW_ALL_ORIGINS = True
    response = answer(
        RequestFactory().get("/v1/models", HTTP_ORIGIN=OTHER, HTTP_AUTHORIZATION=f"Bearer {valid_key.plaintext}")
    )

    assert response["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in response


@pytest.mark.parametrize(
    ("path", "allow"), [("/v1/completions", "POST, OPTIONS"), ("/v1/models", "GET, HEAD, OPTIONS")]
)
def test_a_plain_options_names_the_methods(path, allow):
    response = answer(RequestFactory().options(path))

    assert response.status_code == 200
    assert response["Allow"] == allow
    assert response.content == b""


def test_the_sites_pages_send_no_cors_headers(settings):
    settings.CORS_ALLOW_ALL_ORIGINS = True

    response = Client().get("/account/login/", headers={"Origin": OTHER})

    assert response.status_code == 200
    assert cors_headers(response) == {}
