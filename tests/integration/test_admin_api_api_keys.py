"""``/v1/organization/projects/{user_id}/api_keys``: a user's API keys (users stand for OpenAI's projects)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from keys.models import APIKey
from tests.admin_api import delete, get, post
from tests.conftest import issue
from tests.inprocess_api import MODEL, body
from tests.inprocess_api import post as complete

pytestmark = pytest.mark.django_db(transaction=True)


def keys_path(user, key: APIKey | str | None = None) -> str:
    path = f"/projects/user_{user.pk}/api_keys"
    if key is None:
        return path
    return f"{path}/{key if isinstance(key, str) else 'key_' + key.prefix}"


def test_a_key_is_openais_project_api_key_with_its_settings(admin_key, user, valid_key):
    answer = get(keys_path(user, valid_key.api_key), admin_key.plaintext)

    key = valid_key.api_key
    assert answer.status == 200
    assert answer.body == {
        "object": "organization.project.api_key",
        "redacted_value": f"sk-cs-{key.prefix}...",
        "name": "alice laptop",
        "created_at": int(key.created_at.timestamp()),
        "last_used_at": None,
        "id": f"key_{key.prefix}",
        "owner_project_access": "active",
        "owner": {
            "type": "user",
            "user": {
                "id": f"user_{user.pk}",
                "email": "",
                "name": "alice",
                "created_at": int(user.date_joined.timestamp()),
                "role": "reader",
            },
        },
        "expires_at": None,
        "models": [],
        "max_requests_per_1_minute": None,
        "max_tokens_per_1_minute": None,
        "max_concurrent_requests": None,
        "max_tokens_per_1_month": None,
        "max_budget": None,
        "budget_period": None,
    }


def test_the_list_holds_the_users_unrevoked_keys_only(admin_key, user, valid_key, revoked_key, other_users_key):
    second = issue(user, "alice second")

    page = get(keys_path(user), admin_key.plaintext).body

    assert [k["id"] for k in page["data"]] == [f"key_{valid_key.api_key.prefix}", f"key_{second.api_key.prefix}"]
    assert page["has_more"] is False and page["first_id"] == page["data"][0]["id"]


def test_the_list_pages(admin_key, user):
    made = [issue(user, f"k{i}") for i in range(3)]

    first = get(keys_path(user), admin_key.plaintext, limit=2).body
    rest = get(keys_path(user), admin_key.plaintext, limit=2, after=first["last_id"]).body

    assert first["has_more"] is True and rest["has_more"] is False
    assert [k["id"] for k in first["data"] + rest["data"]] == [f"key_{m.api_key.prefix}" for m in made]


def test_after_another_users_key_names_after(admin_key, user, other_users_key):
    answer = get(keys_path(user), admin_key.plaintext, after=f"key_{other_users_key.api_key.prefix}")

    assert answer.status == 400 and answer.error["param"] == "after"


def test_a_key_created_through_the_api_works_at_once_with_its_settings(tiny_api, admin_key, user):
    answer = post(
        keys_path(user),
        admin_key.plaintext,
        {
            "name": "ci",
            "models": [MODEL, "other-model"],
            "max_requests_per_1_minute": 2,
            "max_tokens_per_1_minute": 1000,
            "max_concurrent_requests": 1,
            "max_tokens_per_1_month": 5000,
            "expires_at": 4102444800,
        },
    )

    assert answer.status == 200
    created = answer.body
    assert created["value"].startswith("sk-cs-") and created["object"] == "organization.project.api_key"
    key = APIKey.objects.get(prefix=created["id"].removeprefix("key_"))
    assert (key.owner, key.name, key.models) == (user, "ci", [MODEL, "other-model"])
    assert (key.rpm_limit, key.tpm_limit, key.max_concurrent, key.monthly_token_quota) == (2, 1000, 1, 5000)
    assert key.expires_at == datetime(2100, 1, 1, tzinfo=timezone.utc)
    assert created["max_requests_per_1_minute"] == 2 and created["models"] == [MODEL, "other-model"]
    assert key.verify(created["value"])
    assert complete(created["value"], body()).status == 200
    assert "value" not in get(keys_path(user, key), admin_key.plaintext).body  # shown once


def test_a_key_deleted_through_the_api_is_refused_at_once(tiny_api, admin_key, user, valid_key):
    assert complete(valid_key.plaintext, body()).status == 200

    answer = delete(keys_path(user, valid_key.api_key), admin_key.plaintext)

    assert answer.body == {
        "object": "organization.project.api_key.deleted",
        "id": f"key_{valid_key.api_key.prefix}",
        "deleted": True,
    }
    assert complete(valid_key.plaintext, body()).status == 401
    assert get(keys_path(user, valid_key.api_key), admin_key.plaintext).status == 404
    assert delete(keys_path(user, valid_key.api_key), admin_key.plaintext).status == 404


def test_updating_a_keys_models_applies_to_its_next_request(tiny_api, admin_key, user, valid_key):
    assert complete(valid_key.plaintext, body()).status == 200

    answer = post(keys_path(user, valid_key.api_key), admin_key.plaintext, {"models": ["other-model"]})

    assert answer.status == 200 and answer.body["models"] == ["other-model"]
    assert complete(valid_key.plaintext, body()).error["code"] == "model_not_found"


def test_an_update_changes_only_the_fields_it_names(admin_key, user, limited_key):
    answer = post(
        keys_path(user, limited_key.api_key), admin_key.plaintext, {"name": "renamed", "max_tokens_per_1_month": None}
    )

    limited_key.api_key.refresh_from_db()
    assert answer.body["name"] == "renamed" and limited_key.api_key.name == "renamed"
    assert (limited_key.api_key.rpm_limit, limited_key.api_key.monthly_token_quota) == (3, None)


def test_an_expiry_set_in_the_past_refuses_the_key_at_once(tiny_api, admin_key, user, valid_key):
    post(keys_path(user, valid_key.api_key), admin_key.plaintext, {"expires_at": 1_000_000})

    assert complete(valid_key.plaintext, body()).status == 401


@pytest.mark.parametrize(
    ("request_body", "param", "code"),
    [
        ({}, "name", "missing_required_parameter"),
        ({"name": 5}, "name", "invalid_type"),
        ({"name": ""}, "name", "empty_string"),
        ({"name": "x" * 101}, "name", "string_above_max_length"),
        ({"name": "k", "models": "tiny"}, "models", "invalid_type"),
        ({"name": "k", "models": ["a b"]}, "models[0]", "invalid_value"),
        ({"name": "k", "models": ["ok", 7]}, "models[1]", "invalid_type"),
        ({"name": "k", "max_requests_per_1_minute": -1}, "max_requests_per_1_minute", "integer_below_min_value"),
        ({"name": "k", "max_requests_per_1_minute": "10"}, "max_requests_per_1_minute", "invalid_type"),
        ({"name": "k", "max_tokens_per_1_minute": 1.5}, "max_tokens_per_1_minute", "invalid_type"),
        ({"name": "k", "max_concurrent_requests": 2**31}, "max_concurrent_requests", "integer_above_max_value"),
        ({"name": "k", "max_tokens_per_1_month": True}, "max_tokens_per_1_month", "invalid_type"),
        ({"name": "k", "expires_at": "tomorrow"}, "expires_at", "invalid_type"),
        ({"name": "k", "expires_at": 4102444800, "expires_in_seconds": 60}, "expires_in_seconds", "invalid_value"),
        ({"name": "k", "expires_in_seconds": 0}, "expires_in_seconds", "integer_below_min_value"),
        ({"name": "k", "scopes": ["api.all.read"]}, "scopes", "unsupported_parameter"),
        ({"name": "k", "colour": "blue"}, None, None),
    ],
)
def test_an_invalid_key_request_names_the_parameter(admin_key, user, request_body, param, code):
    answer = post(keys_path(user), admin_key.plaintext, request_body)

    assert answer.status == 400, answer.body
    assert (answer.error["param"], answer.error["code"]) == (param, code)
    assert not APIKey.objects.filter(owner=user).exists()


def test_an_invalid_update_changes_nothing(admin_key, user, limited_key):
    answer = post(
        keys_path(user, limited_key.api_key), admin_key.plaintext, {"name": "ok", "max_concurrent_requests": -2}
    )

    limited_key.api_key.refresh_from_db()
    assert answer.error["param"] == "max_concurrent_requests"
    assert (limited_key.api_key.name, limited_key.api_key.max_concurrent) == ("alice limited", 2)


def test_another_users_key_is_not_found_under_this_user(admin_key, user, other_users_key):
    for answer in (
        get(keys_path(user, other_users_key.api_key), admin_key.plaintext),
        post(keys_path(user, other_users_key.api_key), admin_key.plaintext, {"name": "mine"}),
        delete(keys_path(user, other_users_key.api_key), admin_key.plaintext),
    ):
        assert answer.status == 404
    assert not other_users_key.api_key.__class__.objects.get(pk=other_users_key.api_key.pk).is_revoked


def test_an_unknown_user_or_key_is_a_404(admin_key, user):
    assert get("/projects/user_999999/api_keys", admin_key.plaintext).status == 404
    assert post("/projects/user_999999/api_keys", admin_key.plaintext, {"name": "x"}).status == 404
    assert get(keys_path(user, "key_nokey123"), admin_key.plaintext).status == 404
    assert get(keys_path(user, "abc"), admin_key.plaintext).status == 404


def test_a_key_revoked_while_its_update_runs_is_a_404_and_stays_revoked(admin_key, user, valid_key, monkeypatch):
    from organization.views import UserKeysViewSet

    found = UserKeysViewSet.key

    def found_then_revoked(self, *args):
        api_key = found(self, *args)
        APIKey.objects.get(pk=api_key.pk).revoke()  # another process, meanwhile
        return api_key

    monkeypatch.setattr(UserKeysViewSet, "key", found_then_revoked)

    answer = post(keys_path(user, valid_key.api_key), admin_key.plaintext, {"max_requests_per_1_minute": 5})

    valid_key.api_key.refresh_from_db()
    assert answer.status == 404 and valid_key.api_key.is_revoked and valid_key.api_key.rpm_limit is None
