"""Adversarial requests to the Administration API (and the usage API it shares code with): each
answer is OpenAI's error shape with a 4xx, never a 500, and a 500 that does happen is logged."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from organization import views as organization_views
from tests.admin_api import BASE, call

pytestmark = pytest.mark.django_db


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- OPTIONS: DRF's metadata needs a serializer_class, which our views do not have -------------


@pytest.mark.parametrize("path", ["/users", "/users/user_1", "/admin_api_keys", "/projects/user_1/api_keys"])
def test_options_with_an_admin_key_is_openais_405_not_a_500(admin_key, path):
    answer = call("OPTIONS", path, admin_key.plaintext, None)

    assert answer.status == 405
    assert answer.error["message"] == f"Invalid URL (OPTIONS {BASE}{path})"


# --- A body nested deeper than the JSON parser's recursion limit --------------------------------


def test_a_deeply_nested_json_body_is_a_400_not_a_500(admin_key):
    nested = "[" * 100_000 + "]" * 100_000
    response = Client().post(
        BASE + "/users", nested, content_type="application/json", headers=bearer(admin_key.plaintext)
    )

    assert response.status_code == 400
    assert "could not parse the JSON body" in response.json()["error"]["message"]


# --- NUL characters: PostgreSQL refuses them in a query (ValueError, a 500); SQLite does not -----

NUL_QUERIES = [
    ("/audit_logs", {"actor_ids[]": "\x00"}, "actor_ids"),
    ("/audit_logs", {"resource_ids": "key_\x00"}, "resource_ids"),
    ("/audit_logs", {"after": "\x00"}, "after"),
    ("/audit_logs", {"before": "audit_log-\x00"}, "before"),
    ("/users", {"emails": "a\x00@example.org"}, "emails"),
    ("/users", {"after": "user_\x00"}, "after"),
    ("/admin_api_keys", {"after": "key_\x00"}, "after"),
    ("/usage/completions", {"start_time": "0", "api_key_ids": "key_\x00"}, "api_key_ids"),
    ("/usage/completions", {"start_time": "0", "models[]": "\x00"}, "models"),
    ("/usage/completions", {"start_time": "0", "user_ids": "\x00"}, "user_ids"),
]


@pytest.mark.parametrize(("path", "query", "param"), NUL_QUERIES)
def test_a_nul_character_in_a_query_parameter_is_a_400_naming_it(admin_key, path, query, param):
    answer = call("GET", path, admin_key.plaintext, None, **query)

    assert answer.status == 400
    assert answer.error["param"] == param
    assert answer.error["code"] == "invalid_value"


def test_a_nul_character_in_a_project_api_keys_cursor_is_a_400(admin_key):
    answer = call(
        "GET", f"/projects/user_{admin_key.admin_key.owner_id}/api_keys", admin_key.plaintext, None, after="key_\x00"
    )

    assert (answer.status, answer.error["param"]) == (400, "after")


@pytest.mark.parametrize(
    "path",
    ["/admin_api_keys/key_%00", "/users/user_%00", "/projects/user_1/api_keys/key_%00", "/projects/user_%00/api_keys"],
)
def test_a_nul_character_in_a_path_id_is_a_404(admin_key, path):
    answer = call("GET", path, admin_key.plaintext, None)

    assert answer.status == 404
    assert answer.error["type"] == "invalid_request_error"


def test_a_nul_character_in_the_key_scoped_usage_api_is_a_400(valid_key):
    response = Client().get(
        "/v1/usage/completions", {"start_time": "0", "models": "\x00"}, headers=bearer(valid_key.plaintext)
    )

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "models"


# --- A 500 on an API path is still logged, with its traceback -----------------------------------


def test_an_unexpected_error_on_the_administration_api_is_logged_with_its_traceback(admin_key, monkeypatch, caplog):
    def explode(self, request):
        raise RuntimeError("adversarial boom")

    monkeypatch.setattr(organization_views.UserViewSet, "list", explode)
    client = Client(raise_request_exception=False)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = client.get(BASE + "/users", headers=bearer(admin_key.plaintext))

    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"
    # The redacting filter (completions_site/logs.py) keeps the traceback as its redacted text only.
    logged = [r for r in caplog.records if r.name == "django.request" and (r.exc_info or r.exc_text)]
    assert logged, "the 500's exception was not logged"
    record = logged[0]
    text = record.exc_text or logging.Formatter().formatException(record.exc_info)
    assert "RuntimeError: adversarial boom" in text


# --- Two requests creating the same username at once ---------------------------------------------


def test_a_username_taken_between_validation_and_insert_is_the_same_400_not_a_500(admin_key, monkeypatch):
    """What two concurrent POST /users with one username do: both pass the serializer's check, the
    second INSERT fails on the unique constraint (seen live: 500s among 16 concurrent requests)."""
    from django.contrib.auth import get_user_model

    from organization import serializers as shapes

    get_user_model().objects.create_user(username="racer")
    monkeypatch.setattr(shapes.UserCreateRequestSerializer, "validate_username", lambda self, value: value)

    answer = call("POST", "/users", admin_key.plaintext, {"username": "racer"})

    assert answer.status == 400
    assert (answer.error["param"], answer.error["code"]) == ("username", "invalid_value")
    assert "already exists" in answer.error["message"]


# --- The schema route needs no key: it must not cost a schema generation per request --------------


def test_the_openapi_schema_is_generated_once_per_process_not_per_request(monkeypatch):
    """Unauthenticated, ~100 ms of CPU each: 8 clients looping on it took the p50 of every other
    request on the process from 4 ms to 185 ms (measured live), the engine's process included."""
    from drf_spectacular.generators import SchemaGenerator

    calls = []
    original = SchemaGenerator.get_schema
    monkeypatch.setattr(SchemaGenerator, "get_schema", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    answers = [call("GET", "/openapi.json", None, None, **query) for query in ({}, {}, {"version": "x"}, {})]

    assert [answer.status for answer in answers] == [200, 200, 200, 200]
    assert len(calls) <= 1
    assert answers[2].body == answers[0].body  # ?version= is no way around the cache


# --- A chunked body (no Content-Length): DRF reads none, and the change silently did not happen ----


def test_a_chunked_body_without_content_length_is_read_not_ignored(admin_key, user):
    """Seen live: ``curl -H 'Transfer-Encoding: chunked'`` to a rate limit answered 200 with the limit
    unchanged (DRF takes a request without Content-Length for one without a body), while
    ``/v1/completions`` reads the same body.  Through the ASGI request, as daphne delivers it."""
    import json

    from django.test import AsyncRequestFactory

    from keys.models import APIKey

    api_key, _ = APIKey.objects.create_key(name="chunked", owner=user)
    body = json.dumps({"max_requests_per_1_minute": 7})
    request = AsyncRequestFactory().generic(
        "POST", f"{BASE}/projects/user_{user.pk}/rate_limits/rl_{api_key.prefix}", body,
        content_type="application/json", headers=bearer(admin_key.plaintext),
    )  # fmt: skip
    del request.META["CONTENT_LENGTH"]  # what a chunked request's META holds
    view = organization_views.ProjectRateLimitViewSet.as_view({"post": "update"})

    response = view(request, project_id=f"user_{user.pk}", rate_limit_id=f"rl_{api_key.prefix}")

    assert response.status_code == 200, response.data
    api_key.refresh_from_db()
    assert api_key.rpm_limit == 7
