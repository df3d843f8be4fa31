"""A database that does not answer is a 503 with ``Retry-After``, never a 500, and ``/healthz`` says so.

The outage is simulated by making the database call raise ``OperationalError`` (what Django raises
when PostgreSQL is down or restarting); on PostgreSQL, a pooled connection closed by the server is
also tested for real.
"""

from __future__ import annotations

import json
import sys

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError, connection
from django.test import AsyncClient, RequestFactory

from api.handlers import APIHandler
from keys.db import database_health
from keys.models import UsageRecord
from tests.inprocess_api import body, get, post

pytestmark = pytest.mark.django_db(transaction=True)

UNAVAILABLE = {
    "message": "The server cannot reach its database right now; retry the request shortly.",
    "type": "server_error",
    "param": None,
    "code": "database_unavailable",
}


def database_down(*args, **kwargs):
    raise OperationalError("connection to server at 127.0.0.1, port 5432 failed: Connection refused")


def healthz() -> tuple[int, dict]:
    response = async_to_sync(AsyncClient().get)("/healthz")
    return response.status_code, json.loads(response.content)


@pytest.mark.parametrize("call", ["completion", "models"])
def test_a_request_that_cannot_reach_the_database_to_authenticate_gets_a_503_with_retry_after(
    tiny_api, valid_key, monkeypatch, call
):
    monkeypatch.setattr("keys.auth._find_key", database_down)

    reply = post(valid_key.plaintext, body()) if call == "completion" else get(valid_key.plaintext, "/v1/models")

    assert reply.status == 503 and reply.headers["retry-after"] == "5"
    assert reply.body == {"error": UNAVAILABLE}
    assert not UsageRecord.objects.exists()  # nothing was served, nothing is charged


def test_healthz_says_the_database_is_unreachable_while_it_lasts(tiny_api, valid_key, monkeypatch):
    assert healthz()[0] == 200 and healthz()[1]["database"] == "ok"
    with monkeypatch.context() as patched:
        patched.setattr("keys.auth._find_key", database_down)
        post(valid_key.plaintext, body())

        status, state = healthz()

        assert status == 503 and (state["status"], state["database"]) == ("unavailable", "unreachable")

    assert post(valid_key.plaintext, body()).status == 200  # the database answers again
    assert healthz()[0] == 200 and healthz()[1]["database"] == "ok"


def test_a_quota_that_must_be_read_from_an_unreachable_database_is_a_503(tiny_api, quota_key, monkeypatch):
    limiter_module = sys.modules["keys.limits.limiter"]  # the package's "limiter" is its function
    monkeypatch.setattr(limiter_module, "totals_in_database", database_down)

    reply = post(quota_key.plaintext, body(max_tokens=2))

    assert reply.status == 503 and reply.headers["retry-after"] == "5" and reply.error == UNAVAILABLE


def test_any_api_view_that_loses_the_database_answers_503_not_500(valid_key, monkeypatch):
    monkeypatch.setattr("api.usage_views.usage_page", database_down)
    request = RequestFactory().get(
        "/v1/usage/completions?start_time=0", HTTP_AUTHORIZATION=f"Bearer {valid_key.plaintext}"
    )

    response = async_to_sync(APIHandler().get_response_async)(request)

    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert json.loads(response.content) == {"error": UNAVAILABLE}
    assert not database_health.reachable


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's connection pool")
def test_a_pooled_connection_closed_by_a_database_restart_costs_no_request(tiny_api, valid_key):
    import psycopg

    assert post(valid_key.plaintext, body()).status == 200  # the pool now holds idle connections
    connection.close()  # this thread's too goes back to the pool
    params = connection.get_connection_params()
    params.pop("pool", None)
    with psycopg.connect(**params, autocommit=True) as admin:  # what a restart does to every connection
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )

    assert post(valid_key.plaintext, body()).status == 200
