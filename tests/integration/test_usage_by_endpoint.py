"""Chat and legacy usage told apart: the dashboard's table and filter, the CSV export, the usage API."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone

import pytest
from django.utils import timezone as django_timezone

from tests.usage_helpers import add_usage

pytestmark = [pytest.mark.django_db, pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume")]

CHAT, LEGACY = "/v1/chat/completions", "/v1/completions"
DAY0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
T0 = int(DAY0.timestamp())


@pytest.fixture
def mixed_usage(valid_key):
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=1), endpoint=CHAT, prompt_tokens=30, completion_tokens=3)
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=2), endpoint=CHAT, prompt_tokens=20, completion_tokens=2)
    add_usage(valid_key.api_key, DAY0 + timedelta(hours=3), endpoint=LEGACY, prompt_tokens=7, completion_tokens=1)


def usage_api(client, key, **params):
    return client.get("/v1/usage/completions", params, headers={"Authorization": f"Bearer {key.plaintext}"}).json()


def test_the_usage_api_groups_by_endpoint_as_our_extension(client, valid_key, mixed_usage):
    body = usage_api(client, valid_key, start_time=T0, end_time=T0 + 86400, group_by="endpoint")

    results = body["data"][0]["results"]
    assert {(r["endpoint"], r["input_tokens"], r["num_model_requests"]) for r in results} == {
        (CHAT, 50, 2),
        (LEGACY, 7, 1),
    }


def test_the_usage_api_filters_by_endpoint_and_keeps_openais_shape_otherwise(client, valid_key, mixed_usage):
    body = usage_api(client, valid_key, start_time=T0, end_time=T0 + 86400, endpoints=CHAT)

    [result] = body["data"][0]["results"]
    assert result["input_tokens"] == 50 and "endpoint" not in result


@pytest.fixture
def recent_mixed_usage(valid_key):
    now = django_timezone.now() - timedelta(minutes=5)
    add_usage(valid_key.api_key, now, endpoint=CHAT, prompt_tokens=30, completion_tokens=3)
    add_usage(valid_key.api_key, now, endpoint=LEGACY, prompt_tokens=7, completion_tokens=1)


def test_the_dashboard_has_a_per_endpoint_table_and_filter(client, staff_user, recent_mixed_usage):
    client.force_login(staff_user)

    page = client.get("/admin/dashboard/").content.decode()
    filtered = client.get("/admin/dashboard/", {"endpoint": CHAT})

    assert 'id="per-endpoint"' in page and CHAT in page and LEGACY in page
    assert [row["endpoint"] for row in filtered.context["endpoints"]] == [CHAT]


def test_the_csv_export_names_each_rows_endpoint_and_follows_the_filter(client, staff_user, recent_mixed_usage):
    client.force_login(staff_user)

    response = client.get("/admin/dashboard/export.csv", {"endpoint": CHAT})

    rows = list(csv.DictReader(io.StringIO(b"".join(response).decode())))
    assert [row["endpoint"] for row in rows] == [CHAT]
