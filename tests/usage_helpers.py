"""Usage records and key patterns for tests of the dashboard, the admin, the account pages and the usage API."""

from __future__ import annotations

import itertools
import re
from datetime import datetime

from keys.models import APIKey, UsageRecord

MODEL = "smollm2-135m-instruct"
KEY_IN_TEXT = re.compile(r"sk-cs-[A-Za-z0-9]{8}\.[A-Za-z0-9_-]{43}")  # a plaintext key in a page
_ids = itertools.count(1)


def add_usage(api_key: APIKey | None, at: datetime, **fields) -> UsageRecord:
    """One usage record of ``api_key`` (its owner's) created at ``at``; successful unless told."""
    prompt, completion = fields.pop("prompt_tokens", 10), fields.pop("completion_tokens", 5)
    return UsageRecord.objects.create(
        api_key=api_key,
        owner=api_key.owner if api_key is not None else None,
        model=fields.pop("model", MODEL),
        request_id=f"cmpl-test{next(_ids):06d}",
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        status_code=fields.pop("status_code", 200),
        latency_ms=fields.pop("latency_ms", 100.0),
        time_to_first_token_ms=fields.pop("time_to_first_token_ms", 20.0),
        created_at=at,
        **fields,
    )
