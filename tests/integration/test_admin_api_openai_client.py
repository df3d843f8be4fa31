"""The official ``openai`` client's Administration API calls (``client.admin.organization``) against ours.

The client talks to Django in this process through a WSGI transport, so what it sends and parses
is exactly what it would over the network: OpenAI's paths, query parameters, bodies and shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import httpx2
import pytest
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from openai import OpenAI

from keys.models import APIKey
from tests.conftest import issue
from tests.usage_helpers import add_usage

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(admin_key) -> Iterator[OpenAI]:
    transport = httpx2.WSGITransport(app=get_wsgi_application())
    # As Django's test client does: a request must not close the connection that holds the test's
    # transaction (with PostgreSQL's pool it was handed back, and the next query found none).
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield OpenAI(
            api_key="unused",
            admin_api_key=admin_key.plaintext,
            base_url="http://testserver/v1",
            http_client=httpx2.Client(transport=transport),
            max_retries=0,
        )
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def test_the_client_pages_through_the_users(admin_client, staff_user, django_user_model):
    for i in range(4):
        django_user_model.objects.create_user(username=f"user{i}")

    users = list(admin_client.admin.organization.users.list(limit=2))

    assert [u.id for u in users] == [f"user_{u.pk}" for u in django_user_model.objects.order_by("pk")]
    assert users[0].role == "owner" and users[1].role == "reader"


def test_the_client_filters_users_by_email(admin_client, user, other_user):
    other_user.email = "bob@example.org"
    other_user.save()

    found = list(admin_client.admin.organization.users.list(emails=["bob@example.org", "nobody@example.org"]))

    assert [u.id for u in found] == [f"user_{other_user.pk}"]


def test_the_client_retrieves_modifies_and_deletes_a_user(admin_client, user):
    users = admin_client.admin.organization.users

    assert users.retrieve(f"user_{user.pk}").name == "alice"
    assert users.update(f"user_{user.pk}", role="owner").role == "owner"
    assert users.delete(f"user_{user.pk}").deleted is True


def test_the_client_manages_admin_keys(admin_client, admin_key):
    keys = admin_client.admin.organization.admin_api_keys

    created = keys.create(name="from the client", expires_in_seconds=3600)

    assert created.value.startswith("sk-cs-admin-") and created.expires_at is not None
    assert keys.retrieve(created.id).name == "from the client"
    assert [k.id for k in keys.list()] == [f"key_{admin_key.admin_key.prefix}", created.id]
    assert keys.delete(created.id).deleted is True


def test_the_client_reads_updates_and_deletes_a_users_api_keys(admin_client, user, limited_key):
    project = f"user_{user.pk}"
    api_keys = admin_client.admin.organization.projects.api_keys
    key_id = f"key_{limited_key.api_key.prefix}"

    assert [k.id for k in api_keys.list(project)] == [key_id]
    assert api_keys.retrieve(key_id, project_id=project).owner.user.id == project
    updated = api_keys.update(key_id, project_id=project, expires_in_seconds=600)
    assert updated.id == key_id
    limited_key.api_key.refresh_from_db()
    assert limited_key.api_key.expires_at is not None
    assert api_keys.delete(key_id, project_id=project).deleted is True
    assert APIKey.objects.get(pk=limited_key.api_key.pk).is_revoked


def test_the_client_lists_and_updates_rate_limits(admin_client, user, limited_key):
    project = f"user_{user.pk}"
    issue(user, "second")
    rate_limits = admin_client.admin.organization.projects.rate_limits

    listed = list(rate_limits.list_rate_limits(project, limit=1))
    updated = rate_limits.update_rate_limit(
        f"rl_{limited_key.api_key.prefix}", project_id=project, max_requests_per_1_minute=7
    )

    assert len(listed) == 2 and listed[0].max_requests_per_1_minute == 3
    assert updated.max_requests_per_1_minute == 7 and updated.max_tokens_per_1_minute == 100


def test_the_client_sets_a_keys_limits_for_one_model_and_lists_them(admin_client, user, limited_key):
    project = f"user_{user.pk}"
    rate_limits = admin_client.admin.organization.projects.rate_limits

    updated = rate_limits.update_rate_limit(
        f"rl_{limited_key.api_key.prefix}:big", project_id=project, max_tokens_per_1_minute=5000
    )
    listed = list(rate_limits.list_rate_limits(project))

    assert (updated.model, updated.max_requests_per_1_minute, updated.max_tokens_per_1_minute) == ("big", 0, 5000)
    assert [(limit.id, limit.model) for limit in listed] == [
        (f"rl_{limited_key.api_key.prefix}", "*"),
        (f"rl_{limited_key.api_key.prefix}:big", "big"),
    ]


def test_the_client_pages_through_the_audit_log_newest_first(admin_client, admin_key, user):
    for name in ("one", "two", "three"):
        issue(user, name)

    entries = list(admin_client.admin.organization.audit_logs.list(event_types=["api_key.created"], limit=2))
    newest = APIKey.objects.order_by("-pk").first()
    only_it = admin_client.admin.organization.audit_logs.list(resource_ids=[f"key_{newest.prefix}"])

    assert [e.type for e in entries] == ["api_key.created"] * 3  # two pages of 2, followed by the client
    assert [e.id for e in only_it.data] == [entries[0].id]
    assert getattr(entries[0], "api_key.created")["id"] == f"key_{newest.prefix}"


def test_the_client_reads_everyones_usage_grouped_by_user(admin_client, valid_key, other_user, user):
    add_usage(valid_key.api_key, datetime(2026, 3, 1, 1, tzinfo=timezone.utc), prompt_tokens=7)
    start = int(datetime(2026, 3, 1, tzinfo=timezone.utc).timestamp())

    page = admin_client.admin.organization.usage.completions(
        start_time=start, end_time=start + 86400, group_by=["user_id", "api_key_id"], user_ids=[f"user_{user.pk}"]
    )

    (result,) = page.data[0].results
    assert (result.user_id, result.api_key_id, result.input_tokens) == (
        f"user_{user.pk}",
        f"key_{valid_key.api_key.prefix}",
        7,
    )
