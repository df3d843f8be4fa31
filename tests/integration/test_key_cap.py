"""A user holds at most ``API_USER_MAX_KEYS`` active keys (or their own cap), on every surface that creates one."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from keys.models import APIKey, UserLimits
from tests.admin_api import get, post
from tests.conftest import issue

pytestmark = pytest.mark.django_db

CAP_MESSAGE = "already has 2 active API keys, the most allowed; revoke one before creating another."


@pytest.fixture
def two_keys_held(user, settings):
    """Alice holds two keys, the site's cap; a revoked and an expired one do not count."""
    settings.API_USER_MAX_KEYS = 2
    issue(user, "revoked").api_key.revoke()
    issue(user, "expired", expires_at=timezone.now() - timedelta(days=1))
    issue(user, "one"), issue(user, "two")
    return user


@pytest.fixture
def staff_client(client, staff_user):
    client.force_login(staff_user)
    return client


def test_the_account_page_refuses_a_key_over_the_cap(client, two_keys_held):
    client.force_login(two_keys_held)

    response = client.post("/account/keys/create/", {"name": "third"})

    assert response.status_code == 400 and CAP_MESSAGE in response.content.decode()
    assert not APIKey.objects.filter(name="third").exists()


def test_revoking_a_key_makes_room_for_another(client, two_keys_held):
    client.force_login(two_keys_held)
    APIKey.objects.get(name="one").revoke()

    assert client.post("/account/keys/create/", {"name": "third"}).status_code == 201


def test_the_admin_refuses_a_key_over_the_owners_cap(staff_client, two_keys_held):
    response = staff_client.post(
        reverse("admin:keys_apikey_add"), {"name": "third", "owner": two_keys_held.pk, "budget_period": ""}
    )

    assert response.status_code == 200 and CAP_MESSAGE in response.content.decode()
    assert not APIKey.objects.filter(name="third").exists()


def test_the_administration_api_refuses_a_key_over_the_cap(admin_key, two_keys_held):
    answer = post(f"/projects/user_{two_keys_held.pk}/api_keys", admin_key.plaintext, {"name": "third"})

    assert answer.status == 400 and answer.error["code"] == "too_many_api_keys"
    assert CAP_MESSAGE in answer.error["message"]


def test_the_command_refuses_a_key_over_the_cap(two_keys_held):
    with pytest.raises(CommandError, match="the most allowed"):
        call_command("create_api_key", "--name", "third", "--user", "alice", stdout=StringIO())


def test_a_users_own_cap_overrides_the_default_and_zero_lifts_it(user, settings):
    settings.API_USER_MAX_KEYS = 1
    UserLimits.objects.create(user=user, max_keys=0)

    for index in range(3):
        issue(user, f"key {index}")

    assert APIKey.objects.filter(owner=user).count() == 3


def test_the_administration_api_sets_a_users_limits_and_cap(admin_key, user, settings):
    settings.API_USER_MAX_KEYS = 20
    path = f"/users/user_{user.pk}/limits"

    before = get(path, admin_key.plaintext).body
    answer = post(
        path,
        admin_key.plaintext,
        {"max_requests_per_1_minute": 5, "max_budget": 12.5, "budget_period": "daily", "max_api_keys": 1},
    )

    assert before["max_api_keys"] is None and before["effective"]["max_api_keys"] == 20
    assert answer.status == 200
    assert (answer.body["max_requests_per_1_minute"], answer.body["max_budget"], answer.body["budget_period"]) == (
        5,
        12.5,
        "daily",
    )
    assert answer.body["effective"]["max_api_keys"] == 1 and answer.body["effective"]["max_tokens_per_1_minute"] == 0
    issue(user, "the one")
    refused = post(f"/projects/user_{user.pk}/api_keys", admin_key.plaintext, {"name": "second"})
    assert refused.status == 400 and refused.error["code"] == "too_many_api_keys"
