"""``GET /v1/usage/completions``: OpenAI's usage API shape, scoped to the calling key's owner."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.conftest import issue
from tests.usage_helpers import MODEL, add_usage

pytestmark = pytest.mark.django_db

URL = "/v1/usage/completions"
DAY0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
T0 = int(DAY0.timestamp())
SPEC = Path(__file__).resolve().parents[3] / "shared" / "openai-openapi.yaml"


def get(client, key, **params):
    return client.get(URL, params, headers={"Authorization": f"Bearer {key.plaintext}"})


@pytest.fixture
def usage(valid_key, other_users_key, user):
    """Alice: two keys, two models, over three days; Bob: a lot of usage of his own."""
    second = issue(user, "alice second")
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=1), prompt_tokens=10, completion_tokens=1)
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=1, minutes=30), prompt_tokens=20, completion_tokens=2)
    add_usage(second.api_key, DAY0 + timedelta(hours=2), model="other-model", prompt_tokens=5, completion_tokens=5)
    add_usage(valid_key.api_key, DAY0 + timedelta(days=2), prompt_tokens=1, completion_tokens=1)
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=3), status_code=400, prompt_tokens=0, completion_tokens=0)
    add_usage(other_users_key.api_key, DAY0 + timedelta(hours=1), prompt_tokens=9999, completion_tokens=9999)
    return second


def test_daily_buckets_sum_the_owners_tokens_and_requests(client, valid_key, usage):
    body = get(client, valid_key, start_time=T0, end_time=T0 + 3 * 86400).json()

    assert body["object"] == "page" and body["has_more"] is False and body["next_page"] is None
    assert [(b["object"], b["start_time"], b["end_time"]) for b in body["data"]] == [
        ("bucket", T0 + d * 86400, T0 + (d + 1) * 86400) for d in range(3)
    ]
    first = body["data"][0]["results"]
    assert len(first) == 1
    assert first[0]["object"] == "organization.usage.completions.result"
    assert (first[0]["input_tokens"], first[0]["output_tokens"], first[0]["num_model_requests"]) == (35, 8, 3)
    assert first[0]["model"] is None and first[0]["api_key_id"] is None
    assert body["data"][1]["results"] == []  # an empty bucket is listed, without results
    assert body["data"][2]["results"][0]["num_model_requests"] == 1


def test_another_users_usage_never_appears(client, other_users_key, usage):
    body = get(client, other_users_key, start_time=T0, end_time=T0 + 3 * 86400, group_by="api_key_id").json()

    results = [result for bucket in body["data"] for result in bucket["results"]]
    assert [r["api_key_id"] for r in results] == [f"key_{other_users_key.api_key.prefix}"]
    assert results[0]["input_tokens"] == 9999


def test_group_by_model_and_api_key_id(client, valid_key, usage):
    body = get(client, valid_key, start_time=T0, end_time=T0 + 86400, **{"group_by[]": ["model", "api_key_id"]}).json()

    results = body["data"][0]["results"]
    by_group = {(r["model"], r["api_key_id"]): (r["input_tokens"], r["num_model_requests"]) for r in results}
    assert by_group == {
        (MODEL, f"key_{valid_key.api_key.prefix}"): (30, 2),
        ("other-model", f"key_{usage.api_key.prefix}"): (5, 1),
    }


def test_hourly_buckets_and_a_clipped_first_bucket(client, valid_key, usage):
    start = T0 + 3600 + 1800  # 01:30: the first bucket starts there and ends at 02:00
    body = get(client, valid_key, start_time=start, end_time=T0 + 4 * 3600, bucket_width="1h").json()

    spans = [(b["start_time"], b["end_time"]) for b in body["data"]]
    assert spans == [(start, T0 + 7200), (T0 + 7200, T0 + 10800), (T0 + 10800, T0 + 14400)]
    assert [sum(r["num_model_requests"] for r in b["results"]) for b in body["data"]] == [1, 1, 0]


def test_minute_buckets(client, valid_key, usage):
    body = get(client, valid_key, start_time=T0 + 3600, end_time=T0 + 3600 + 120, bucket_width="1m").json()

    assert [b["start_time"] for b in body["data"]] == [T0 + 3600, T0 + 3660]
    assert body["data"][0]["results"][0]["input_tokens"] == 10


def test_pages_follow_next_page_until_the_end(client, valid_key, usage):
    seen, params = [], {"start_time": T0, "end_time": T0 + 3 * 86400, "limit": 2}
    while True:
        body = get(client, valid_key, **params).json()
        seen += [bucket["start_time"] for bucket in body["data"]]
        if not body["has_more"]:
            assert body["next_page"] is None
            break
        assert body["next_page"].startswith("page_")
        params["page"] = body["next_page"]
    assert seen == [T0, T0 + 86400, T0 + 2 * 86400]


def test_models_and_api_key_ids_filter(client, valid_key, usage):
    only_model = get(client, valid_key, start_time=T0, end_time=T0 + 86400, models="other-model").json()
    only_key = get(
        client, valid_key, start_time=T0, end_time=T0 + 86400, api_key_ids=f"key_{valid_key.api_key.prefix}"
    ).json()

    assert only_model["data"][0]["results"][0]["input_tokens"] == 5
    assert only_key["data"][0]["results"][0]["input_tokens"] == 30


@pytest.mark.parametrize(
    ("params", "param", "code"),
    [
        ({}, "start_time", "missing_required_parameter"),
        ({"start_time": "yesterday"}, "start_time", "invalid_type"),
        ({"start_time": -1}, "start_time", "integer_below_min_value"),
        ({"start_time": T0, "end_time": T0}, "end_time", "integer_below_min_value"),
        ({"start_time": T0, "end_time": "1e9"}, "end_time", "invalid_type"),
        ({"start_time": T0, "bucket_width": "1w"}, "bucket_width", "invalid_value"),
        ({"start_time": T0, "group_by": "project_id"}, "group_by[0]", "invalid_value"),
        ({"start_time": T0, "group_by": "model,batch"}, "group_by[1]", "invalid_value"),
        ({"start_time": T0, "bucket_width": "1d", "limit": 32}, "limit", "integer_above_max_value"),
        ({"start_time": T0, "bucket_width": "1m", "limit": 1441}, "limit", "integer_above_max_value"),
        ({"start_time": T0, "limit": 0}, "limit", "integer_below_min_value"),
        ({"start_time": T0, "limit": "ten"}, "limit", "invalid_type"),
        ({"start_time": T0, "page": "page_garbage"}, "page", "invalid_value"),
        ({"start_time": 253402300800, "end_time": 253402400800}, "start_time", "integer_above_max_value"),  # 10000
        ({"start_time": T0, "end_time": 253402300800}, "end_time", "integer_above_max_value"),
    ],
)
def test_bad_parameters_are_400s_with_openais_codes(client, valid_key, params, param, code):
    response = get(client, valid_key, **params)

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert set(error) == {"message", "type", "param", "code"}
    assert f"'{param}'" in error["message"]


def test_a_bad_parameter_reads_like_openai(client, valid_key):
    limit = get(client, valid_key, start_time=T0, limit="ten").json()["error"]
    width = get(client, valid_key, start_time=T0, bucket_width="1w").json()["error"]
    missing = get(client, valid_key).json()["error"]

    assert limit["message"] == "Invalid type for 'limit': expected an integer, but got a string instead."
    assert width["message"] == "Invalid value for 'bucket_width': '1w'. Supported values are: '1m', '1h', and '1d'."
    assert missing["message"] == "Missing required parameter: 'start_time'."


def test_without_a_key_it_is_a_401(client):
    response = client.get(URL, {"start_time": T0})

    assert response.status_code == 401
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_revoked_key_is_a_401(client, revoked_key):
    assert get(client, revoked_key, start_time=T0).status_code == 401


def test_the_default_end_is_now_and_the_default_width_a_day(client, valid_key):
    start = int((datetime.now(timezone.utc) - timedelta(days=2)).timestamp())

    body = get(client, valid_key, start_time=start).json()

    assert len(body["data"]) == 3  # the clipped first day, yesterday, today so far
    assert all(b["end_time"] - b["start_time"] <= 86400 for b in body["data"])


@pytest.mark.skipif(not SPEC.exists(), reason="OpenAI's spec is not beside the checkout (../shared)")
def test_the_answer_is_a_valid_usage_response_of_openais_spec(client, valid_key, usage):
    import yaml
    from jsonschema import Draft202012Validator

    from tools.vendor_openai_schema import vendor

    with SPEC.open(encoding="utf-8") as handle:
        spec = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    document = vendor(spec, roots=("UsageResponse",))
    validator = Draft202012Validator({**document, "$ref": "#/$defs/UsageResponse"})
    body = get(client, valid_key, start_time=T0, end_time=T0 + 3 * 86400, group_by="model,api_key_id", limit=2).json()

    errors = list(validator.iter_errors(body))
    assert not errors, errors[0].message


def test_another_method_is_a_405_in_openais_shape(client, valid_key):
    response = client.post(URL, {}, headers={"Authorization": f"Bearer {valid_key.plaintext}"})

    assert response.status_code == 405 and response["Allow"] == "GET, HEAD, OPTIONS"
    assert response.json()["error"]["type"] == "invalid_request_error"
