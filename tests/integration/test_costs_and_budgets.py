"""Costs (model prices → usage records → the costs APIs) and money budgets per key and per user.

One place computes cost (``keys.pricing.cost_nanos``); a budget is a counter like the monthly
quota, reserved at admission at the request's largest cost and settled to its real one.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync

from api.auth import admit
from api.translate import LimitExceeded
from keys import limits, periods, pricing
from keys.models import ModelPrice, UsageRecord, UserLimits
from keys.usage import record_usage
from tests import admin_api
from tests.conftest import issue
from tests.inprocess_api import body, get, post

pytestmark = pytest.mark.django_db(transaction=True)

UNLIMITED = {"rpm_limit": 0, "tpm_limit": 0, "max_concurrent": 0, "monthly_token_quota": 0}
# The tiny model's request (tests.inprocess_api.body): 5 prompt tokens and 4 completion tokens, at
# 1 and 2 per million tokens: 1000 and 2000 nanos a token.
REQUEST_NANOS = 5 * 1000 + 4 * 2000


@pytest.fixture
def priced(db):
    return ModelPrice.objects.create(model="tiny", prompt_per_million=1, completion_per_million=2)


def test_cost_is_rounded_up_to_a_whole_nano_and_free_without_a_price():
    price = pricing.Price(Decimal("0.15"), Decimal("0.6"))

    assert pricing.cost_nanos(price, 1, 0) == 150
    assert pricing.cost_nanos(pricing.Price(Decimal("0.0001"), Decimal(0)), 1, 0) == 1  # 0.1 nano: rounded up
    assert pricing.cost_nanos(pricing.FREE, 10**6, 10**6) == 0
    assert pricing.to_money(REQUEST_NANOS) == Decimal("0.000013")


def test_a_served_request_records_its_cost_and_the_costs_apis_show_it(tiny_api, priced, user, admin_key):
    key = issue(user, "priced", **UNLIMITED)

    assert post(key.plaintext, body()).status == 200

    record = UsageRecord.objects.get()
    assert (record.prompt_tokens, record.completion_tokens, record.cost_nanos) == (5, 4, REQUEST_NANOS)
    start = int(periods.midnight(periods.usage_day(record.created_at)).timestamp())
    own = get(key.plaintext, f"/v1/costs?start_time={start}&group_by=line_item").body
    assert own["data"][0]["results"] == [
        {
            "object": "organization.costs.result",
            "amount": {"value": 0.000013, "currency": "usd"},
            "line_item": "tiny",
            "project_id": None,
        }
    ]
    everyone = admin_api.get("/costs", admin_key.plaintext, start_time=start, group_by="project_id").body
    assert everyone["data"][0]["results"][0]["project_id"] == f"user_{user.pk}"
    assert everyone["data"][0]["results"][0]["amount"]["value"] == 0.000013


def test_a_price_change_does_not_rewrite_recorded_costs(priced, valid_key):
    async def write(request_id):
        return await record_usage(
            request_id=request_id, api_key=valid_key.api_key, model="tiny", status_code=200, latency_ms=1.0,
            prompt_tokens=5, completion_tokens=4,
        )  # fmt: skip

    before = async_to_sync(write)("cmpl-before")
    priced.prompt_per_million = 100
    priced.save()
    after = async_to_sync(write)("cmpl-after")

    before.refresh_from_db()
    assert (before.cost_nanos, after.cost_nanos) == (REQUEST_NANOS, 5 * 100_000 + 4 * 2000)


def test_the_administration_api_sets_lists_and_removes_prices(admin_key):
    answer = admin_api.post(
        "/model_prices",
        admin_key.plaintext,
        {"model": "tiny", "prompt_per_million": 0.15, "completion_per_million": 0.6},
    )
    listed = admin_api.get("/model_prices", admin_key.plaintext).body
    removed = admin_api.delete("/model_prices/tiny", admin_key.plaintext)

    assert answer.status == 200 and (answer.body["prompt_per_million"], answer.body["completion_per_million"]) == (
        0.15,
        0.6,
    )
    assert [price["model"] for price in listed["data"]] == ["tiny"]
    assert removed.body["deleted"] is True and not ModelPrice.objects.exists()
    assert pricing.price_of("tiny") == pricing.FREE  # this process forgot its copy at once


# --- Budgets ------------------------------------------------------------------------------------


def run(*steps):
    """Admit and settle ``(api_key, cost)`` in order; the number admitted and the first refusal."""

    async def scenario():
        for index, (api_key, cost) in enumerate(steps):
            try:
                admission = await admit(api_key, f"cmpl-{index}", 9, cost)
            except LimitExceeded as refused:
                return index, refused
            await admission.settle(9, cost)
        return len(steps), None

    return async_to_sync(scenario)()


def test_a_key_over_its_budget_gets_openais_insufficient_quota(user, limits_store):
    key = issue(user, "budgeted", budget=Decimal("0.00002"), **UNLIMITED).api_key  # 20 000 nanos a month

    admitted, refused = run((key, REQUEST_NANOS), (key, REQUEST_NANOS))

    assert admitted == 1
    assert (refused.status, refused.type, refused.code, refused.headers["x-should-retry"]) == (
        429,
        "insufficient_quota",
        "insufficient_quota",
        "false",
    )
    assert refused.message.startswith(
        "You exceeded your current quota: the budget of this API key is 0.00002 USD per calendar month, "
        "0.000013 USD is spent and this request may cost up to 0.000013 USD"
    )


def test_a_users_budget_binds_across_two_keys(user, limits_store):
    UserLimits.objects.create(user=user, budget=Decimal("0.00002"), budget_period="daily")
    first, second = issue(user, "first", **UNLIMITED).api_key, issue(user, "second", **UNLIMITED).api_key

    admitted, refused = run((first, REQUEST_NANOS), (second, REQUEST_NANOS))

    assert admitted == 1 and refused.code == "insufficient_quota"
    assert "the budget of your account (all of its API keys together) is 0.00002 USD per day" in refused.message
    tomorrow = (periods.now() + timedelta(days=1)).date().isoformat()
    assert refused.message.endswith(f"The budget renews on {tomorrow} (UTC).")


def test_a_settled_request_frees_what_it_did_not_spend(user, limits_store):
    key = issue(user, "budgeted", budget=Decimal("0.00002"), **UNLIMITED).api_key

    admitted, refused = run((key, 15_000), (key, 15_000))  # reserved 15 000 and spent all of it: no room
    assert (admitted, refused.code) == (1, "insufficient_quota")

    async def reserve_more_than_spent():
        first = await admit(key, "cmpl-a", 9, 5_000)
        await first.settle(9, 1_000)  # the reservation was 5 000: 4 000 come back
        return await admit(key, "cmpl-b", 9, 4_000)  # 15 000 + 1 000 + 4 000 = the whole budget

    assert async_to_sync(reserve_more_than_spent)().reserved_cost == 4_000


def test_a_daily_budget_starts_again_the_next_day(user, limits_store, monkeypatch):
    key = issue(user, "daily", budget=Decimal("0.00002"), budget_period="daily", **UNLIMITED).api_key
    assert run((key, REQUEST_NANOS), (key, REQUEST_NANOS))[0] == 1

    tomorrow = periods.now() + timedelta(days=1)
    monkeypatch.setattr(periods, "now", lambda: tomorrow)

    assert run((key, REQUEST_NANOS))[0] == 1


def test_a_budgets_counter_starts_from_the_periods_recorded_costs(priced, user, limits_store):
    key = issue(user, "daily", budget=Decimal("0.00002"), budget_period="daily", **UNLIMITED).api_key
    yesterday = periods.now() - timedelta(days=1)

    async def write(request_id: str, created_at: datetime):
        await record_usage(
            request_id=request_id, api_key=key, model="tiny", status_code=200, latency_ms=1.0,
            prompt_tokens=5, completion_tokens=4, created_at=created_at,
        )  # fmt: skip

    async_to_sync(write)("cmpl-yesterday", yesterday)
    async_to_sync(write)("cmpl-today", periods.now())
    scopes = async_to_sync(limits.scopes_of)(key)

    assert limits.totals_in_database(scopes[0]) == (
        9 * 2 if yesterday.month == periods.now().month else 9,
        REQUEST_NANOS,
    )
    assert run((key, REQUEST_NANOS))[0] == 0  # 13 000 spent today + 13 000 > 20 000


def test_the_dashboard_shows_cost_per_model_and_user(client, staff_user, priced, valid_key):
    async def write():
        await record_usage(
            request_id="cmpl-1", api_key=valid_key.api_key, model="tiny", status_code=200, latency_ms=1.0,
            prompt_tokens=5, completion_tokens=4,
        )  # fmt: skip

    async_to_sync(write)()
    client.force_login(staff_user)

    page = client.get("/admin/dashboard/").content.decode()

    assert page.count('<td class="num">0.000013</td>') == 2  # the per-model row and the user's row
