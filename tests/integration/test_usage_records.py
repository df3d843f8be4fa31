"""Usage records: what ``record_usage`` writes for one request."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from keys.models import DailyUsage, UsageRecord
from keys.usage import record_usage

pytestmark = pytest.mark.django_db(transaction=True)


def record(**fields) -> UsageRecord:
    base = {"model": "smollm2-135m-instruct", "request_id": "cmpl-1", "status_code": 200, "latency_ms": 42.0}
    return async_to_sync(record_usage)(**{**base, **fields})


def test_a_record_stores_the_request_and_defaults_owner_and_total(valid_key):
    record(
        api_key=valid_key.api_key,
        prompt_tokens=5,
        completion_tokens=7,
        stream=True,
        finish_reason="stop,length",
        time_to_first_token_ms=3.5,
        user="end-user-1",
    )

    stored = UsageRecord.objects.get(request_id="cmpl-1")
    assert stored.api_key == valid_key.api_key
    assert stored.owner == valid_key.api_key.owner
    assert (stored.prompt_tokens, stored.completion_tokens, stored.total_tokens) == (5, 7, 12)
    assert stored.stream and stored.finish_reason == "stop,length"
    assert stored.time_to_first_token_ms == 3.5 and stored.user == "end-user-1"
    assert stored.endpoint == "/v1/completions"


def test_a_request_that_failed_authentication_is_recorded_without_key_or_owner():
    stored = record(status_code=401, error_type="invalid_request_error")

    assert stored.api_key is None and stored.owner is None
    assert UsageRecord.objects.get(pk=stored.pk).error_type == "invalid_request_error"


def test_an_explicit_total_is_kept(valid_key):
    assert record(api_key=valid_key.api_key, prompt_tokens=1, completion_tokens=1, total_tokens=5).total_tokens == 5


def test_an_overlong_user_field_is_cut_to_fit_instead_of_losing_the_record():
    stored = record(user="u" * 10_000)

    assert UsageRecord.objects.get(pk=stored.pk).user == "u" * 256


def test_no_text_field_keeps_a_key_secret():
    pasted = "sk-cs-AbCd1234.Zm9vYmFyYmF6cXV4LXNlY3JldC10b2tlbi0wMTIzNDU2Nzg5"
    stored = UsageRecord.objects.get(pk=record(model=pasted, user=pasted, error_type=pasted).pk)

    assert stored.model == stored.user == stored.error_type == "sk-cs-AbCd1234.***"


def test_a_request_id_is_recorded_once_and_a_second_write_changes_nothing(valid_key):
    first = record(api_key=valid_key.api_key, prompt_tokens=5)

    again = record(api_key=valid_key.api_key, prompt_tokens=50)

    assert again.pk == first.pk and UsageRecord.objects.get().prompt_tokens == 5
    assert DailyUsage.objects.get().prompt_tokens == 5


def test_records_survive_the_deletion_of_their_key(valid_key):
    stored = record(api_key=valid_key.api_key)

    valid_key.api_key.delete()

    stored.refresh_from_db()
    assert stored.api_key is None and stored.owner is not None


def test_records_are_listed_newest_first():
    now = timezone.now()
    record(request_id="cmpl-old", created_at=now - timedelta(minutes=1))
    record(request_id="cmpl-new", created_at=now)

    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == ["cmpl-new", "cmpl-old"]
