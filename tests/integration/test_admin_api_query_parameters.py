"""Query parameters of the usage and audit-log routes: ``project_ids`` names users; nothing is ignored.

Seen live: ``project_ids`` on ``/v1/organization/usage/completions`` and ``/audit_logs`` answered
everyone's data, as did any misspelt parameter.  Users stand where OpenAI's projects stand, so
``project_ids`` keeps those users' data; any other parameter these routes do not read is a 400.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.test import Client

from audit.models import AuditLogEntry
from keys.ids import api_key_id, user_id
from tests.conftest import issue
from tests.usage_helpers import add_usage

pytestmark = pytest.mark.django_db

USAGE = "/v1/organization/usage/completions"
AUDIT = "/v1/organization/audit_logs"
OWN_USAGE = "/v1/usage/completions"
DAY0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
T0 = int(DAY0.timestamp())


@pytest.fixture
def admin_client(admin_key):
    return Client(headers={"Authorization": f"Bearer {admin_key.plaintext}"})


@pytest.fixture
def key_client(valid_key):
    return Client(headers={"Authorization": f"Bearer {valid_key.plaintext}"})


def totals(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [result["input_tokens"] for result in response.json()["data"][0]["results"]]


@pytest.mark.parametrize("name", ["project_ids", "project_ids[]"])
def test_usage_project_ids_keep_only_those_users(admin_client, valid_key, other_users_key, other_user, name):
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=1), prompt_tokens=10)
    add_usage(other_users_key.api_key, DAY0 + timedelta(hours=2), prompt_tokens=100)

    kept = admin_client.get(USAGE, {"start_time": T0, "end_time": T0 + 86400, name: user_id(other_user.pk)})

    assert totals(kept) == [100]


def test_usage_project_ids_and_user_ids_together_keep_users_in_both(admin_client, valid_key, user, other_user):
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=1), prompt_tokens=10)
    query = {"start_time": T0, "end_time": T0 + 86400, "project_ids": user_id(user.pk)}

    assert totals(admin_client.get(USAGE, {**query, "user_ids": user_id(user.pk)})) == [10]
    assert totals(admin_client.get(USAGE, {**query, "user_ids": user_id(other_user.pk)})) == []


def test_audit_log_project_ids_keep_entries_about_those_users_and_their_keys(admin_client, user, other_user):
    AuditLogEntry.objects.all().delete()
    alices_key = issue(user, "alice ci").api_key
    AuditLogEntry.objects.all().delete()  # the key's own creation: only the entries below
    entries = {}
    for resource in (user_id(user.pk), api_key_id(alices_key.prefix), user_id(other_user.pk), "key_BBBBBBBB"):
        entries[resource] = AuditLogEntry.objects.create(
            type="user.updated" if resource.startswith("user_") else "api_key.updated",
            actor_type="system",
            actor_id="system",
            actor={"type": "system", "system": {"id": "system"}},
            resource_id=resource,
        ).public_id

    body = admin_client.get(AUDIT, {"project_ids[]": user_id(user.pk)}).json()

    assert {entry["id"] for entry in body["data"]} == {
        entries[user_id(user.pk)],
        entries[api_key_id(alices_key.prefix)],
    }
    narrowed = admin_client.get(AUDIT, {"project_ids[]": user_id(user.pk), "resource_ids[]": user_id(user.pk)})
    assert [entry["id"] for entry in narrowed.json()["data"]] == [entries[user_id(user.pk)]]


@pytest.mark.parametrize(
    ("path", "query", "name"),
    [
        (USAGE, {"start_time": T0, "strat_time": T0}, "strat_time"),
        (USAGE, {"start_time": T0, "group_by[model]": "x"}, "group_by[model]"),
        (AUDIT, {"event_type": "api_key.created"}, "event_type"),
        (AUDIT, {"effective_at[since]": 1}, "effective_at[since]"),
        (AUDIT, {"effective_at": 1}, "effective_at"),
    ],
)
def test_an_unknown_parameter_is_openais_unrecognized_argument(admin_client, path, query, name):
    response = admin_client.get(path, query)

    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": f"Unrecognized request argument supplied: {name}",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_the_key_scoped_usage_api_refuses_unknown_parameters_alike(key_client):
    response = key_client.get(OWN_USAGE, {"start_time": T0, "strat_time": T0})

    assert response.status_code == 400
    assert response.json()["error"]["message"] == "Unrecognized request argument supplied: strat_time"


@pytest.mark.parametrize(
    ("path", "query", "param"),
    [
        (USAGE, {"start_time": T0, "batch": "true"}, "batch"),
        (AUDIT, {"actor_emails[]": "sam@example.org"}, "actor_emails"),
        (AUDIT, {"tenant_only": "true"}, "tenant_only"),
    ],
)
def test_a_parameter_of_openais_that_does_not_apply_is_unsupported(admin_client, path, query, param):
    response = admin_client.get(path, query)

    assert response.status_code == 400
    assert (response.json()["error"]["param"], response.json()["error"]["code"]) == (param, "unsupported_parameter")


@pytest.mark.parametrize("name", ["user_ids", "project_ids[]", "batch"])
def test_the_key_scoped_usage_api_says_other_users_filters_do_not_apply(key_client, other_user, name):
    response = key_client.get(OWN_USAGE, {"start_time": T0, name: user_id(other_user.pk)})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_parameter"
    assert response.json()["error"]["param"] == name.removesuffix("[]")


def test_the_parameters_these_routes_read_are_accepted(admin_client, admin_key):
    usage = admin_client.get(
        USAGE,
        {"start_time": T0, "end_time": T0 + 60, "bucket_width": "1m", "group_by[]": "model", "models[]": "m",
         "api_key_ids": "key_x", "user_ids[]": "user_1", "endpoints": "/v1/completions", "limit": 1},
    )  # fmt: skip
    audit = admin_client.get(
        AUDIT,
        {"event_types[]": "api_key.created", "actor_ids": "system", "resource_ids[]": "key_x",
         "effective_at[gt]": 1, "effective_at[lte]": T0, "limit": 5},
    )  # fmt: skip

    assert usage.status_code == 200, usage.content
    assert audit.status_code == 200, audit.content
