"""``GET /v1/organization/usage/completions``: everyone's usage, grouped and filtered by user, key and model."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.test import Client

from keys.ids import api_key_id, user_id
from keys.models import APIKey
from tests.conftest import issue
from tests.usage_helpers import MODEL, add_usage

pytestmark = pytest.mark.django_db

URL = "/v1/organization/usage/completions"
DAY0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
T0 = int(DAY0.timestamp())
SPEC = Path(__file__).resolve().parents[3] / "shared" / "openai-openapi.yaml"


@pytest.fixture
def admin_client(admin_key):
    """Django's test client sending Sam's admin key on every request."""
    return Client(headers={"Authorization": f"Bearer {admin_key.plaintext}"})


@pytest.fixture
def usage(valid_key, other_users_key, user):
    """Alice: two keys and two models on day 0, one request on day 2; Bob: one key on day 0; a failed request."""
    second = issue(user, "alice second")
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=1), prompt_tokens=10, completion_tokens=1)
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=1, minutes=30), prompt_tokens=20, completion_tokens=2)
    add_usage(second.api_key, DAY0 + timedelta(hours=2), model="other-model", prompt_tokens=5, completion_tokens=5)
    add_usage(valid_key.api_key, DAY0 + timedelta(days=2), prompt_tokens=1, completion_tokens=1)
    add_usage(other_users_key.api_key, DAY0 + timedelta(hours=3), prompt_tokens=100, completion_tokens=50)
    add_usage(other_users_key.api_key, DAY0 + timedelta(hours=4), status_code=400, prompt_tokens=0, completion_tokens=0)
    return second


def get(client, **params) -> dict:
    response = client.get(URL, params)
    assert response.status_code == 200, response.content
    return response.json()


def results(body: dict, bucket: int = 0) -> list[dict]:
    return body["data"][bucket]["results"]


def test_daily_buckets_sum_every_users_requests(admin_client, usage):
    body = get(admin_client, start_time=T0, end_time=T0 + 3 * 86400)

    assert body["object"] == "page" and body["has_more"] is False
    assert [b["start_time"] for b in body["data"]] == [T0, T0 + 86400, T0 + 2 * 86400]
    (total,) = results(body)
    assert (total["input_tokens"], total["output_tokens"], total["num_model_requests"]) == (135, 58, 4)
    assert total["user_id"] is None and total["api_key_id"] is None and total["model"] is None
    assert results(body, 1) == []
    assert results(body, 2)[0]["num_model_requests"] == 1


def test_group_by_user_id(admin_client, usage, user, other_user):
    body = get(admin_client, start_time=T0, end_time=T0 + 86400, group_by="user_id")

    by_user = {r["user_id"]: (r["input_tokens"], r["output_tokens"], r["num_model_requests"]) for r in results(body)}
    assert by_user == {user_id(user.pk): (35, 8, 3), user_id(other_user.pk): (100, 50, 1)}
    assert all(r["api_key_id"] is None and r["model"] is None for r in results(body))


def test_group_by_api_key_id_spans_every_user(admin_client, usage, valid_key, other_users_key):
    body = get(admin_client, start_time=T0, end_time=T0 + 86400, **{"group_by[]": "api_key_id"})

    by_key = {r["api_key_id"]: r["input_tokens"] for r in results(body)}
    assert by_key == {
        api_key_id(valid_key.api_key.prefix): 30,
        api_key_id(usage.api_key.prefix): 5,
        api_key_id(other_users_key.api_key.prefix): 100,
    }


def test_group_by_user_id_and_model(admin_client, usage, user, other_user):
    body = get(admin_client, start_time=T0, end_time=T0 + 86400, **{"group_by[]": ["user_id", "model"]})

    grouped = {(r["user_id"], r["model"]): r["num_model_requests"] for r in results(body)}
    assert grouped == {
        (user_id(user.pk), MODEL): 2,
        (user_id(user.pk), "other-model"): 1,
        (user_id(other_user.pk), MODEL): 1,
    }


def test_user_ids_keep_only_those_users(admin_client, usage, other_user):
    body = get(admin_client, start_time=T0, end_time=T0 + 86400, user_ids=user_id(other_user.pk))

    assert [(r["input_tokens"], r["num_model_requests"]) for r in results(body)] == [(100, 1)]


def test_user_ids_naming_nobody_keep_nothing(admin_client, usage):
    body = get(admin_client, start_time=T0, end_time=T0 + 86400, **{"user_ids[]": ["user_999999", "alice"]})

    assert results(body) == []


def test_api_key_ids_and_models_filter_across_users(admin_client, usage, valid_key, other_users_key):
    keys = [api_key_id(valid_key.api_key.prefix), api_key_id(other_users_key.api_key.prefix)]
    by_keys = get(admin_client, start_time=T0, end_time=T0 + 86400, **{"api_key_ids[]": keys})
    by_model = get(admin_client, start_time=T0, end_time=T0 + 86400, models="other-model")
    both = get(admin_client, start_time=T0, end_time=T0 + 86400, models=MODEL, api_key_ids=keys[1])

    assert results(by_keys)[0]["input_tokens"] == 130
    assert results(by_model)[0]["input_tokens"] == 5
    assert results(both)[0]["input_tokens"] == 100


def test_pages_follow_next_page(admin_client, usage):
    seen, params = [], {"start_time": T0, "end_time": T0 + 3 * 86400, "limit": 2, "group_by": "user_id"}
    while True:
        body = get(admin_client, **params)
        seen += [(b["start_time"], len(b["results"])) for b in body["data"]]
        if not body["has_more"]:
            break
        params["page"] = body["next_page"]

    assert seen == [(T0, 2), (T0 + 86400, 0), (T0 + 2 * 86400, 1)]


@pytest.mark.parametrize(
    ("params", "param", "code"),
    [
        ({}, "start_time", "missing_required_parameter"),
        ({"start_time": "yesterday"}, "start_time", "invalid_type"),
        ({"start_time": T0, "end_time": T0}, "end_time", "integer_below_min_value"),
        ({"start_time": T0, "bucket_width": "1w"}, "bucket_width", "invalid_value"),
        ({"start_time": T0, "group_by": "project_id"}, "group_by[0]", "invalid_value"),
        ({"start_time": T0, "group_by": "user_id,batch"}, "group_by[1]", "invalid_value"),
        ({"start_time": T0, "bucket_width": "1d", "limit": 32}, "limit", "integer_above_max_value"),
        ({"start_time": T0, "page": "page_nonsense"}, "page", "invalid_value"),
    ],
)
def test_a_bad_parameter_is_the_same_400_as_the_key_scoped_api(admin_client, valid_key, params, param, code):
    organization = admin_client.get(URL, params)
    own = admin_client.get("/v1/usage/completions", params, headers={"Authorization": f"Bearer {valid_key.plaintext}"})

    assert organization.status_code == own.status_code == 400
    assert organization.json()["error"]["param"] == param
    assert organization.json()["error"]["code"] == code
    if "group_by" not in params:  # the key-scoped API knows no user_id, so its list of values differs
        assert organization.json() == own.json()


def test_the_key_scoped_api_still_refuses_group_by_user_id(client, valid_key):
    response = client.get(
        "/v1/usage/completions",
        {"start_time": T0, "group_by": "user_id"},
        headers={"Authorization": f"Bearer {valid_key.plaintext}"},
    )

    assert response.status_code == 400 and response.json()["error"]["param"] == "group_by[0]"


def test_only_an_admin_key_may_read_everyones_usage(client, staff_user, valid_key, revoked_admin_key):
    anonymous = client.get(URL, {"start_time": T0})
    revoked = client.get(URL, {"start_time": T0}, headers={"Authorization": f"Bearer {revoked_admin_key.plaintext}"})
    with_an_api_key = client.get(URL, {"start_time": T0}, headers={"Authorization": f"Bearer {valid_key.plaintext}"})
    client.force_login(staff_user)
    staff_session = client.get(URL, {"start_time": T0})

    assert [r.status_code for r in (anonymous, revoked, with_an_api_key, staff_session)] == [401, 401, 403, 401]
    for response in (anonymous, revoked, with_an_api_key, staff_session):
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_another_method_is_a_405_in_openais_shape(admin_client):
    response = admin_client.delete(URL)

    assert response.status_code == 405
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.skipif(not SPEC.exists(), reason="OpenAI's spec is not beside the checkout (../shared)")
def test_the_answer_is_a_valid_usage_response_of_openais_spec(admin_client, usage):
    import yaml
    from jsonschema import Draft202012Validator

    from tools.vendor_openai_schema import vendor

    with SPEC.open(encoding="utf-8") as handle:
        spec = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    document = vendor(spec, roots=("UsageResponse",))
    validator = Draft202012Validator({**document, "$ref": "#/$defs/UsageResponse"})
    body = get(admin_client, start_time=T0, end_time=T0 + 3 * 86400, group_by="user_id,api_key_id,model", limit=2)

    errors = list(validator.iter_errors(body))
    assert not errors, errors[0].message


def test_ids_agree_with_the_administration_api_and_the_audit_log(admin_client, admin_key, user):
    users = {u["username"]: u["id"] for u in admin_client.get("/v1/organization/users").json()["data"]}
    created = admin_client.post(
        f"/v1/organization/projects/{users['alice']}/api_keys", {"name": "ids"}, content_type="application/json"
    ).json()
    add_usage(APIKey.objects.get(prefix=created["id"].removeprefix("key_")), DAY0 + timedelta(hours=1))

    body = get(admin_client, start_time=T0, end_time=T0 + 86400, group_by="user_id,api_key_id")
    logged = admin_client.get("/v1/organization/audit_logs", {"resource_ids": created["id"]}).json()["data"]

    assert [(r["user_id"], r["api_key_id"]) for r in results(body)] == [(users["alice"], created["id"])]
    assert [entry["type"] for entry in logged] == ["api_key.created"]
    assert logged[0]["api_key.created"]["data"]["user_id"] == users["alice"]
    assert logged[0]["actor"]["api_key"]["id"] == admin_key.admin_key.public_id
