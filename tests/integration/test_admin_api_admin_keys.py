"""Admin keys: ``/v1/organization/admin_api_keys``, ``manage.py create_admin_key`` and the Django admin."""

from __future__ import annotations

import re
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from organization.models import AdminAPIKey
from tests.admin_api import delete, get, post

pytestmark = pytest.mark.django_db

ADMIN_KEY_IN_TEXT = re.compile(r"sk-cs-admin-[A-Za-z0-9]{8}\.[A-Za-z0-9_-]+")


def owner_shape(user) -> dict:
    return {
        "type": "user",
        "object": "organization.user",
        "id": f"user_{user.pk}",
        "name": user.username,
        "created_at": int(user.date_joined.timestamp()),
        "role": "owner",
    }


def test_an_admin_key_is_openais_admin_api_key(admin_key, staff_user):
    key = admin_key.admin_key

    answer = get(f"/admin_api_keys/key_{key.prefix}", admin_key.plaintext)

    key.refresh_from_db()
    assert answer.body == {
        "object": "organization.admin_api_key",
        "id": f"key_{key.prefix}",
        "name": "sam provisioning",
        "redacted_value": f"sk-cs-admin-{key.prefix}...",
        "created_at": int(key.created_at.timestamp()),
        "expires_at": None,
        "last_used_at": int(key.last_used_at.timestamp()),
        "owner": owner_shape(staff_user),
        "scope": "owner",
    }


def test_creating_an_admin_key_returns_its_value_once_and_it_works(admin_key, staff_user):
    answer = post("/admin_api_keys", admin_key.plaintext, {"name": "billing", "expires_in_seconds": 3600})

    created = answer.body
    assert answer.status == 200 and ADMIN_KEY_IN_TEXT.fullmatch(created["value"])
    assert created["owner"] == owner_shape(staff_user)
    assert abs(created["expires_at"] - (time.time() + 3600)) < 60
    assert get("/users", created["value"]).status == 200
    assert "value" not in get(f"/admin_api_keys/{created['id']}", admin_key.plaintext).body
    stored = AdminAPIKey.objects.get(prefix=created["id"].removeprefix("key_"))
    assert created["value"] not in (stored.hashed_key, stored.prefix) and stored.verify(created["value"])


def test_the_list_holds_the_unrevoked_admin_keys(admin_key, revoked_admin_key, staff_user):
    second = post("/admin_api_keys", admin_key.plaintext, {"name": "second"}).body

    page = get("/admin_api_keys", admin_key.plaintext).body

    assert [k["id"] for k in page["data"]] == [f"key_{admin_key.admin_key.prefix}", second["id"]]
    assert page["has_more"] is False and page["last_id"] == second["id"]
    assert get("/admin_api_keys", admin_key.plaintext, limit=1).body["has_more"] is True


def test_deleting_an_admin_key_refuses_it_at_once(admin_key, staff_user):
    other = post("/admin_api_keys", admin_key.plaintext, {"name": "temporary"}).body

    answer = delete(f"/admin_api_keys/{other['id']}", admin_key.plaintext)

    assert answer.body == {"id": other["id"], "object": "organization.admin_api_key.deleted", "deleted": True}
    assert get("/users", other["value"]).status == 401
    assert get(f"/admin_api_keys/{other['id']}", admin_key.plaintext).status == 404
    assert delete(f"/admin_api_keys/{other['id']}", admin_key.plaintext).status == 404


@pytest.mark.parametrize(
    ("request_body", "param", "code"),
    [
        ({}, "name", "missing_required_parameter"),
        ({"name": None}, "name", "invalid_type"),
        ({"name": "k", "expires_in_seconds": 0}, "expires_in_seconds", "integer_below_min_value"),
        ({"name": "k", "expires_in_seconds": 31_536_001}, "expires_in_seconds", "integer_above_max_value"),
        ({"name": "k", "expires_in_seconds": "1h"}, "expires_in_seconds", "invalid_type"),
    ],
)
def test_an_invalid_admin_key_request_names_the_parameter(admin_key, request_body, param, code):
    answer = post("/admin_api_keys", admin_key.plaintext, request_body)

    assert answer.status == 400 and (answer.error["param"], answer.error["code"]) == (param, code)
    assert AdminAPIKey.objects.count() == 1


@pytest.mark.parametrize("key_id", ["key_nothing1", "abc", "key_"])
def test_an_unknown_admin_key_is_a_404(admin_key, key_id):
    assert get(f"/admin_api_keys/{key_id}", admin_key.plaintext).status == 404
    assert delete(f"/admin_api_keys/{key_id}", admin_key.plaintext).status == 404


# --- The command and the admin --------------------------------------------------------------------


def test_the_command_prints_a_working_key_alone_on_its_last_line(staff_user):
    out = StringIO()
    call_command("create_admin_key", "--name", "ops", "--expires-in", "30d", stdout=out)

    plaintext = out.getvalue().strip().splitlines()[-1]
    assert ADMIN_KEY_IN_TEXT.fullmatch(plaintext)
    key = AdminAPIKey.objects.get(name="ops")
    assert key.owner == staff_user and key.expires_at is not None
    assert get("/users", plaintext).status == 200


def test_the_command_refuses_an_owner_who_is_not_staff(user):
    with pytest.raises(CommandError, match="not active staff"):
        call_command("create_admin_key", "--name", "ops", "--user", "alice", stdout=StringIO())


def test_staff_create_an_admin_key_in_the_admin_and_see_it_once(client, staff_user):
    client.force_login(staff_user)

    response = client.post(
        reverse("admin:organization_adminapikey_add"),
        {
            "name": "from the admin",
            "owner": staff_user.pk,
            "scope": "owner",
            "expires_at_0": "",
            "expires_at_1": "",
            "_save": "Save",
        },
        follow=True,
    )

    shown = ADMIN_KEY_IN_TEXT.findall(response.content.decode())
    assert len(shown) == 1
    listing = client.get(reverse("admin:organization_adminapikey_changelist")).content.decode()
    assert not ADMIN_KEY_IN_TEXT.search(listing)
    assert get("/users", shown[0]).status == 200


def test_staff_revoke_admin_keys_in_the_admin(client, staff_user, admin_key):
    client.force_login(staff_user)

    client.post(
        reverse("admin:organization_adminapikey_changelist"),
        {"action": "revoke_selected", "_selected_action": [admin_key.admin_key.pk]},
        follow=True,
    )

    assert get("/users", admin_key.plaintext).status == 401
