"""A request the engine's full queue refuses (503) is charged nothing: no tokens recorded, none settled."""

from __future__ import annotations

import dataclasses

import pytest

from keys.models import UsageRecord
from tests.inprocess_api import body, post

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_503_for_a_full_queue_records_and_settles_no_tokens(tiny_api, limited_key, monkeypatch):
    full = dataclasses.replace(tiny_api.config, max_queue=0)  # every submission finds the queue full
    with monkeypatch.context() as patch:
        patch.setattr(tiny_api, "config", full)
        refused = post(limited_key.plaintext, body())
    answered = post(limited_key.plaintext, body())

    assert refused.status == 503 and refused.error["code"] == "server_overloaded"
    record = UsageRecord.objects.get(request_id=refused.request_id)
    assert (record.status_code, record.prompt_tokens, record.completion_tokens) == (503, 0, 0)
    # The limit's counter holds only the answered request's reservation (5 prompt + 4 max_tokens),
    # not the refused one's prompt tokens.
    assert answered.status == 200
    assert answered.headers["x-ratelimit-remaining-tokens"] == str(100 - 9)
