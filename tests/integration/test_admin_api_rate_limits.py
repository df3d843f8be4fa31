"""``/v1/organization/projects/{user_id}/rate_limits``: a key's limits in the spec's ``ProjectRateLimit`` shape."""

from __future__ import annotations

import pytest

from tests.admin_api import get, post
from tests.inprocess_api import body
from tests.inprocess_api import post as complete

pytestmark = pytest.mark.django_db(transaction=True)


def limits_path(user, key=None) -> str:
    path = f"/projects/user_{user.pk}/rate_limits"
    return path if key is None else f"{path}/rl_{key.prefix}"


def test_each_key_has_one_rate_limit_with_the_limits_in_force(settings, admin_key, user, limited_key, restricted_key):
    settings.API_DEFAULT_MONTHLY_TOKENS = 777

    page = get(limits_path(user), admin_key.plaintext).body

    assert page["object"] == "list" and page["has_more"] is False
    assert page["data"] == [
        {
            "object": "project.rate_limit",
            "id": f"rl_{limited_key.api_key.prefix}",
            "model": "*",
            "max_requests_per_1_minute": 3,
            "max_tokens_per_1_minute": 100,
            "api_key_id": f"key_{limited_key.api_key.prefix}",
            "max_concurrent_requests": 2,
            "max_tokens_per_1_month": 777,  # the site's default
            "max_budget": 0.0,
            "budget_period": "monthly",
        },
        {
            "object": "project.rate_limit",
            "id": f"rl_{restricted_key.api_key.prefix}",
            "model": "other-model,third-model",
            "max_requests_per_1_minute": settings.API_DEFAULT_RPM,
            "max_tokens_per_1_minute": settings.API_DEFAULT_TPM,
            "api_key_id": f"key_{restricted_key.api_key.prefix}",
            "max_concurrent_requests": settings.API_DEFAULT_MAX_CONCURRENT,
            "max_tokens_per_1_month": 777,
            "max_budget": 0.0,
            "budget_period": "monthly",
        },
    ]
    assert get(limits_path(user), admin_key.plaintext, after=page["first_id"]).body["data"] == page["data"][1:]


def test_a_lower_rpm_applies_to_the_keys_next_request(tiny_api, admin_key, user, valid_key):
    assert complete(valid_key.plaintext, body()).status == 200

    answer = post(limits_path(user, valid_key.api_key), admin_key.plaintext, {"max_requests_per_1_minute": 1})

    assert answer.status == 200 and answer.body["max_requests_per_1_minute"] == 1
    refused = complete(valid_key.plaintext, body())
    assert refused.status == 429 and refused.error["code"] == "rate_limit_exceeded"


def test_a_lower_tpm_applies_to_the_keys_next_request(tiny_api, admin_key, user, valid_key):
    post(limits_path(user, valid_key.api_key), admin_key.plaintext, {"max_tokens_per_1_minute": 5})

    assert complete(valid_key.plaintext, body()).status == 429  # 5 prompt + 4 completion tokens


def test_lifting_a_limit_applies_to_the_keys_next_request(tiny_api, admin_key, user, limited_key):
    for _ in range(3):
        assert complete(limited_key.plaintext, body()).status == 200
    assert complete(limited_key.plaintext, body()).status == 429

    answer = post(limits_path(user, limited_key.api_key), admin_key.plaintext, {"max_requests_per_1_minute": 0})

    assert answer.body["max_requests_per_1_minute"] == 0
    assert complete(limited_key.plaintext, body()).status == 200


def test_null_returns_a_limit_to_the_sites_default(settings, admin_key, user, limited_key):
    answer = post(limits_path(user, limited_key.api_key), admin_key.plaintext, {"max_requests_per_1_minute": None})

    limited_key.api_key.refresh_from_db()
    assert limited_key.api_key.rpm_limit is None
    assert answer.body["max_requests_per_1_minute"] == settings.API_DEFAULT_RPM
    assert answer.body["max_tokens_per_1_minute"] == 100  # untouched


def test_the_monthly_quota_set_here_refuses_the_next_request(tiny_api, admin_key, user, valid_key):
    post(limits_path(user, valid_key.api_key), admin_key.plaintext, {"max_tokens_per_1_month": 1})
    complete(valid_key.plaintext, body())

    assert complete(valid_key.plaintext, body()).error["code"] == "insufficient_quota"


@pytest.mark.parametrize(
    ("request_body", "param", "code"),
    [
        ({"max_requests_per_1_minute": -1}, "max_requests_per_1_minute", "integer_below_min_value"),
        ({"max_tokens_per_1_minute": "lots"}, "max_tokens_per_1_minute", "invalid_type"),
        ({"max_images_per_1_minute": 3}, "max_images_per_1_minute", "unsupported_parameter"),
        ({"batch_1_day_max_input_tokens": 3}, "batch_1_day_max_input_tokens", "unsupported_parameter"),
        ({"model": "tiny"}, None, None),
    ],
)
def test_an_invalid_update_names_the_parameter(admin_key, user, limited_key, request_body, param, code):
    answer = post(limits_path(user, limited_key.api_key), admin_key.plaintext, request_body)

    assert answer.status == 400 and (answer.error["param"], answer.error["code"]) == (param, code)
    limited_key.api_key.refresh_from_db()
    assert (limited_key.api_key.rpm_limit, limited_key.api_key.tpm_limit) == (3, 100)


def test_a_revoked_or_another_users_key_has_no_rate_limit_here(admin_key, user, revoked_key, other_users_key):
    assert post(limits_path(user, revoked_key.api_key), admin_key.plaintext, {}).status == 404
    assert post(limits_path(user, other_users_key.api_key), admin_key.plaintext, {}).status == 404
    assert (
        post(f"/projects/user_{user.pk}/rate_limits/key_{revoked_key.api_key.prefix}", admin_key.plaintext, {}).status
        == 404
    )
    assert get(limits_path(user), admin_key.plaintext).body["data"] == []


# --- A key's own limits per model: rl_{prefix}:{model} ---------------------------------------------


def model_limit_path(user, key, model: str) -> str:
    return f"{limits_path(user, key)}:{model}"


def test_a_keys_limits_per_model_are_listed_after_its_own(admin_key, user, limited_key, restricted_key):
    limited_key.api_key.model_limits = {"small": {"tpm": 500}, "big": {"rpm": 60, "tpm": 100000}}
    limited_key.api_key.save()
    prefix = limited_key.api_key.prefix

    page = get(limits_path(user), admin_key.plaintext).body

    assert [entry["id"] for entry in page["data"]] == [
        f"rl_{prefix}",
        f"rl_{prefix}:big",
        f"rl_{prefix}:small",
        f"rl_{restricted_key.api_key.prefix}",
    ]
    assert page["data"][1] == {
        "object": "project.rate_limit",
        "id": f"rl_{prefix}:big",
        "model": "big",
        "max_requests_per_1_minute": 60,
        "max_tokens_per_1_minute": 100000,
        "api_key_id": f"key_{prefix}",
    }
    assert page["data"][2]["max_requests_per_1_minute"] == 0  # none of its own


def test_a_page_holds_whole_keys_and_the_next_starts_after_a_models_limit(admin_key, user, limited_key, restricted_key):
    limited_key.api_key.model_limits = {"big": {"rpm": 60}}
    limited_key.api_key.save()

    first = get(limits_path(user), admin_key.plaintext, limit=1).body
    second = get(limits_path(user), admin_key.plaintext, limit=1, after=first["last_id"]).body

    assert [entry["id"] for entry in first["data"]] == [f"rl_{limited_key.api_key.prefix}", first["last_id"]]
    assert first["last_id"].endswith(":big") and first["has_more"] is True
    assert [entry["id"] for entry in second["data"]] == [f"rl_{restricted_key.api_key.prefix}"]


def test_setting_a_models_limits_applies_to_that_models_next_request_only(two_models, admin_key, user, valid_key):
    from tests.inprocess_api import MODEL, SECOND_MODEL, greedy

    answer = post(
        model_limit_path(user, valid_key.api_key, SECOND_MODEL), admin_key.plaintext, {"max_requests_per_1_minute": 1}
    )

    assert answer.status == 200
    assert answer.body == {
        "object": "project.rate_limit",
        "id": f"rl_{valid_key.api_key.prefix}:{SECOND_MODEL}",
        "model": SECOND_MODEL,
        "max_requests_per_1_minute": 1,
        "max_tokens_per_1_minute": 0,
        "api_key_id": f"key_{valid_key.api_key.prefix}",
    }
    assert complete(valid_key.plaintext, greedy(SECOND_MODEL, max_tokens=1)).status == 200
    refused = complete(valid_key.plaintext, greedy(SECOND_MODEL, max_tokens=1))
    assert refused.status == 429 and f"for {SECOND_MODEL} on this API key" in refused.error["message"]
    assert complete(valid_key.plaintext, greedy(MODEL, max_tokens=1)).status == 200


def test_null_removes_a_models_limit_and_a_model_without_any_leaves_the_list(admin_key, user, valid_key):
    valid_key.api_key.model_limits = {"big": {"rpm": 60, "tpm": 1000}}
    valid_key.api_key.save()
    path = model_limit_path(user, valid_key.api_key, "big")

    tpm_only = post(path, admin_key.plaintext, {"max_requests_per_1_minute": None}).body
    gone = post(path, admin_key.plaintext, {"max_tokens_per_1_minute": 0}).body

    assert (tpm_only["max_requests_per_1_minute"], tpm_only["max_tokens_per_1_minute"]) == (0, 1000)
    assert (gone["max_requests_per_1_minute"], gone["max_tokens_per_1_minute"]) == (0, 0)
    valid_key.api_key.refresh_from_db()
    assert valid_key.api_key.model_limits == {}
    assert [entry["id"] for entry in get(limits_path(user), admin_key.plaintext).body["data"]] == [
        f"rl_{valid_key.api_key.prefix}"
    ]


@pytest.mark.parametrize("name", ["max_concurrent_requests", "max_tokens_per_1_month", "max_budget", "budget_period"])
def test_a_keys_other_limits_are_not_per_model(admin_key, user, valid_key, name):
    answer = post(model_limit_path(user, valid_key.api_key, "big"), admin_key.plaintext, {name: 1})

    assert answer.status == 400 and (answer.error["param"], answer.error["code"]) == (name, "unsupported_parameter")


def test_a_model_id_that_is_none_names_no_rate_limit(admin_key, user, valid_key):
    answer = post(model_limit_path(user, valid_key.api_key, "a%20b"), admin_key.plaintext, {})

    assert (
        answer.status == 404 and answer.error["message"] == f"No such rate limit: 'rl_{valid_key.api_key.prefix}:a b'."
    )
    assert post(limits_path(user, valid_key.api_key) + ":", admin_key.plaintext, {}).status == 404
