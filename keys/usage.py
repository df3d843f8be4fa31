"""Usage accounting: one :class:`UsageRecord` per API request, written by the view in ``finally``."""
from __future__ import annotations

from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models

from .models import UsageRecord


async def record_usage(**fields: Any) -> UsageRecord:
    """Insert and return the usage record of one request (async ORM, one INSERT).

    Fields (those of :class:`UsageRecord`):

    - ``request_id`` (str, required, unique): the response ``id``, e.g. ``"cmpl-..."``, also sent
      as ``x-request-id``.
    - ``model`` (str, required): the served model id.
    - ``status_code`` (int, required): the HTTP status sent (200 for a stream that later failed
      in-band).
    - ``latency_ms`` (float, required): from request start to the last byte.
    - ``api_key`` (APIKey | None): the authenticated key; ``None`` if auth failed.
    - ``owner`` (user | None): defaults to ``api_key.owner``.
    - ``endpoint`` (str): defaults to ``"/v1/completions"``.
    - ``prompt_tokens``, ``completion_tokens`` (int, default 0); ``total_tokens`` defaults to
      their sum.
    - ``stream`` (bool, default False).
    - ``finish_reason`` (str): ``"stop"``, ``"length"``, comma-separated for several choices
      (``"stop,length"``), or ``"interrupted"`` / ``"error"``.
    - ``error_type`` (str): the ``error.type`` returned, if any.
    - ``time_to_first_token_ms`` (float | None).
    - ``user`` (str): the request's OpenAI ``user`` field.

    Text longer than its column is cut to fit, so that a long client-supplied ``user`` can never
    make accounting fail.  Raises ``TypeError`` for an unknown field and ``IntegrityError`` for a
    reused ``request_id``.
    """
    return await UsageRecord.objects.acreate(**_complete(fields))


def _complete(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with the derived defaults filled in and text clipped to the column sizes."""
    fields = dict(fields)
    api_key = fields.get("api_key")
    if api_key is not None and "owner" not in fields and "owner_id" not in fields:
        # owner_id, not owner: reading api_key.owner could be a lazy query in async code.
        fields["owner_id"] = api_key.owner_id
    fields.setdefault("total_tokens", fields.get("prompt_tokens", 0) + fields.get("completion_tokens", 0))
    return {name: _clipped(name, value) for name, value in fields.items()}


def _clipped(name: str, value: Any) -> Any:
    """``value`` cut to the ``max_length`` of the ``CharField`` called ``name``, if it is one."""
    if not isinstance(value, str):
        return value
    try:
        field = UsageRecord._meta.get_field(name)
    except FieldDoesNotExist:  # e.g. owner_id, or a typo that acreate will reject itself
        return value
    if isinstance(field, models.CharField) and field.max_length:
        return value[: field.max_length]
    return value
