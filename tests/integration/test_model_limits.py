"""A key's own requests and tokens per minute for one model (``APIKey.model_limits``), beside its
limits over all models: they refuse that model's requests only, count an alias's under its model,
speak of the model in the 429, and narrow the ``x-ratelimit-*`` headers of that model's answers.

Run against both counter stores (``limits_store``: this process's memory, then Redis), through the
real views serving two models (``two_models``)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from keys.models import APIKey, UsageRecord, validate_model_limits
from tests.conftest import issue
from tests.inprocess_api import MODEL as SMALL
from tests.inprocess_api import SECOND_ALIAS as BIG_ALIAS
from tests.inprocess_api import SECOND_MODEL as BIG
from tests.inprocess_api import greedy, post

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_models_rpm_refuses_that_model_only_and_counts_its_aliases(two_models, limits_store, user):
    key = issue(user, "big twice a minute", model_limits={BIG: {"rpm": 2}})

    admitted = [post(key.plaintext, greedy(name, max_tokens=1)).status for name in (BIG, BIG_ALIAS)]
    refused = post(key.plaintext, greedy(BIG, max_tokens=1))
    other = [post(key.plaintext, greedy(SMALL, max_tokens=1)).status for _ in range(3)]

    assert admitted == [200, 200] and other == [200, 200, 200]
    assert refused.status == 429
    assert refused.error["code"] == "rate_limit_exceeded" and refused.error["type"] == "requests"
    assert refused.error["message"].startswith(
        f"Rate limit reached for requests per min (RPM) for {BIG} on this API key: Limit 2, Used 2, Requested 1."
    )
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(refused.headers["retry-after"]) >= 1
    assert post(key.plaintext, greedy(BIG_ALIAS, max_tokens=1)).status == 429  # the alias is the model
    record = UsageRecord.objects.get(request_id=refused.request_id)
    assert (record.status_code, record.model, record.total_tokens) == (429, BIG, 0)


def test_a_request_larger_than_a_models_tpm_is_refused_naming_the_model(two_models, limits_store, user):
    key = issue(user, "big small tpm", model_limits={BIG: {"tpm": 20}})

    refused = post(key.plaintext, greedy(BIG, "Hello", max_tokens=30))

    assert refused.status == 429 and refused.error["type"] == "tokens"
    assert refused.error["message"].startswith(
        f"Request too large for tokens per min (TPM) for {BIG} on this API key: Limit 20, Requested 35."
    )
    assert post(key.plaintext, greedy(SMALL, "Hello", max_tokens=30)).status == 200  # the key's own tpm is the default
    assert post(key.plaintext, greedy(BIG, "Hello", max_tokens=4)).status == 200


def test_a_models_tokens_per_minute_accumulate_across_its_requests(two_models, limits_store, user):
    key = issue(user, "big 30 tpm", model_limits={BIG: {"rpm": 0, "tpm": 30}})

    first = post(key.plaintext, greedy(BIG, "Hello", max_tokens=10))  # 5 + 10 reserved, 15 used
    second = post(key.plaintext, greedy(BIG, "Hello", max_tokens=10))
    third = post(key.plaintext, greedy(BIG, "Hello", max_tokens=10))

    assert (first.status, second.status, third.status) == (200, 200, 429)
    assert third.error["message"].startswith(f"Rate limit reached for tokens per min (TPM) for {BIG} on this API key")
    assert first.headers["x-ratelimit-limit-tokens"] == "30"
    assert first.headers["x-ratelimit-remaining-tokens"] == "15"


def test_the_headers_of_another_models_answer_are_the_keys_own(two_models, limits_store, user):
    key = issue(user, "big limited", rpm_limit=100, model_limits={BIG: {"rpm": 5}})

    small = post(key.plaintext, greedy(SMALL, max_tokens=1))
    big = post(key.plaintext, greedy(BIG, max_tokens=1))

    assert small.headers["x-ratelimit-limit-requests"] == "100"
    assert big.headers["x-ratelimit-limit-requests"] == "5"  # the scope with the least remaining
    assert big.headers["x-ratelimit-remaining-requests"] == "4"


def test_the_keys_limit_over_all_models_still_binds_every_model(two_models, limits_store, user):
    key = issue(user, "two in all", rpm_limit=2, model_limits={BIG: {"rpm": 10}})

    statuses = [post(key.plaintext, greedy(name, max_tokens=1)).status for name in (SMALL, BIG, BIG)]

    assert statuses == [200, 200, 429]


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(
    "value, message",
    [
        ([], "Write the limits per model"),
        ({"a b": {"rpm": 1}}, "is not a model id"),
        ({"a,b": {"rpm": 1}}, "is not a model id"),
        ({"a": 5}, "must be an object with rpm and tpm"),
        ({"a": {"rpd": 5}}, "“rpd” (for “a”) is not a limit"),
        ({"a": {"rpm": -1}}, "The rpm of “a” must be a whole number"),
        ({"a": {"tpm": 1.5}}, "The tpm of “a” must be a whole number"),
        ({"a": {"rpm": True}}, "The rpm of “a” must be a whole number"),
        ({"a": {"rpm": 2**31}}, "The rpm of “a” must be a whole number from 0 to 2147483647"),
    ],
)
def test_model_limits_that_are_not_whole_numbers_per_model_are_refused(value, message):
    with pytest.raises(ValidationError) as refused:
        validate_model_limits(value)

    assert message in refused.value.messages[0]


@pytest.mark.django_db(transaction=False)
def test_a_model_without_limits_of_its_own_has_none():
    key = APIKey(model_limits={"big": {"rpm": 3}, "zero": {"rpm": 0, "tpm": 0}, "half": {"tpm": 9}})

    assert key.limits_for_model("big") == (3, 0)
    assert key.limits_for_model("half") == (0, 9)
    assert key.limits_for_model("zero") is None and key.limits_for_model("other") is None
    assert APIKey().limits_for_model("big") is None


@pytest.mark.django_db(transaction=False)
def test_changing_one_models_limits_keeps_the_others_and_drops_an_emptied_entry():
    key = APIKey(model_limits={"big": {"rpm": 3, "tpm": 9}, "small": {"tpm": 5}})

    assert key.with_model_limits("big", {"rpm": None}) == {"big": {"tpm": 9}, "small": {"tpm": 5}}
    assert key.with_model_limits("small", {"tpm": 0}) == {"big": {"rpm": 3, "tpm": 9}}
    assert key.with_model_limits("new", {"rpm": 7}) == {**key.model_limits, "new": {"rpm": 7}}
    with pytest.raises(ValidationError):
        key.with_model_limits("not a model", {"rpm": 1})
