"""Usage accounting: one :class:`UsageRecord` per API request, written by the view in ``finally``
through the usage journal (:mod:`keys.journal`), which makes the write survive a database outage.

The record and its day's :class:`DailyUsage` row change in one transaction, so the rollup is
always the sum of the records (``manage.py rebuild_usage_rollup`` recomputes it from them).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone

from . import pricing
from .db import db_call
from .models import ROLLUP_FIELDS, APIKey, DailyUsage, UsageRecord, rollup_increments
from .periods import budget_period_bounds, midnight, month_bounds, usage_day
from .redaction import redact

# A request "reached the model" when it succeeded or consumed tokens (an interrupted stream
# did; a 400 before generation did not).  The usage API counts these as num_model_requests.
MODEL_REQUEST = models.Q(status_code__lt=400) | models.Q(total_tokens__gt=0)


async def record_usage(**fields: Any) -> UsageRecord:
    """Insert and return the usage record of one request, and add it to its day's rollup row.

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
    - ``cost_nanos`` (int): the request's cost (:func:`keys.pricing.cost_nanos`); defaults to its
      tokens at the model's prices when the record is written.
    - ``stream`` (bool, default False).
    - ``finish_reason`` (str): ``"stop"``, ``"length"``, comma-separated for several choices
      (``"stop,length"``), or ``"interrupted"`` / ``"error"``.
    - ``error_type`` (str): the ``error.type`` returned, if any.
    - ``time_to_first_token_ms`` (float | None).
    - ``user`` (str): the request's OpenAI ``user`` field.
    - ``created_at`` (datetime): defaults to now.

    Text is redacted (:func:`keys.redaction.redact`: no key secret is stored) and text longer than
    its column is cut to fit, so that a long client-supplied ``user`` can never make accounting fail.
    Idempotent on ``request_id`` (:func:`write_record`): a record already stored is returned as it
    is.  Raises ``TypeError`` for an unknown field.  The API writes through the usage journal
    (:func:`keys.journal.record`), which calls :func:`write_record` with :func:`prepare_fields`' form.
    """
    record, _ = await db_call(write_record, prepare_fields(fields))
    return record


def write_record(fields: dict[str, Any]) -> tuple[UsageRecord, bool]:
    """Insert one record (fields as :func:`prepare_fields` returns them) and add it to its day's
    rollup row, in one transaction, unless its ``request_id`` is already stored.

    Returns ``(record, created)``; when the request is already recorded, the stored record and
    ``False``, and neither the records nor the rollup change, so a record written twice (a retry
    after a lost acknowledgement) counts once.  A key or owner deleted since the request is
    recorded as ``None``, as if deleted after (``SET_NULL``).  Raises ``IntegrityError`` or
    ``DataError`` for a record the database refuses, ``OperationalError`` when it does not answer.
    """
    if "cost_nanos" not in fields:  # a record from elsewhere than a served request: today's prices
        fields = {
            **fields,
            "cost_nanos": pricing.cost_nanos(
                pricing.price_of(fields.get("model", "")),
                fields.get("prompt_tokens", 0),
                fields.get("completion_tokens", 0),
            ),
        }
    try:
        return _insert(fields), True
    except IntegrityError:
        stored = UsageRecord.objects.filter(request_id=fields["request_id"]).first()
        if stored is not None:
            return stored, False
        kept = _without_deleted_references(fields)
        if kept == fields:
            raise
    return _insert(kept), True


def _insert(fields: dict[str, Any]) -> UsageRecord:
    with transaction.atomic():
        record = UsageRecord.objects.create(**fields)
        DailyUsage.objects.add(record)
    return record


def _without_deleted_references(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with ``api_key_id`` and ``owner_id`` set to ``None`` where their rows are gone."""
    fields = dict(fields)
    if fields.get("api_key_id") is not None and not APIKey.objects.filter(pk=fields["api_key_id"]).exists():
        fields["api_key_id"] = None
    if fields.get("owner_id") is not None and not get_user_model().objects.filter(pk=fields["owner_id"]).exists():
        fields["owner_id"] = None
    return fields


def prepare_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as stored: references as ids (``api_key_id``, ``owner_id``), ``created_at``
    fixed now if absent, the derived ``total_tokens``, text redacted and clipped to the columns.

    The result holds only JSON values and one ``datetime``, so that the usage journal can keep it.
    """
    fields = dict(fields)
    api_key = fields.pop("api_key", None)
    if api_key is not None:
        fields["api_key_id"] = api_key.pk
        if "owner" not in fields and "owner_id" not in fields:
            # owner_id, not owner: reading api_key.owner could be a lazy query in async code.
            fields["owner_id"] = api_key.owner_id
    if "owner" in fields:
        owner = fields.pop("owner")
        fields["owner_id"] = None if owner is None else owner.pk
    fields.setdefault("created_at", timezone.now())
    fields.setdefault("total_tokens", fields.get("prompt_tokens", 0) + fields.get("completion_tokens", 0))
    # Every text field, not only the client's ``user``: a key pasted into any field a client can
    # reach (``model``, an error's text) is not kept.
    return {name: _clipped(name, redact(value) if isinstance(value, str) else value) for name, value in fields.items()}


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


def rebuild_daily_usage(first: date | None = None, last: date | None = None) -> int:
    """Recompute the :class:`DailyUsage` rows of the UTC days ``first``..``last`` from the records.

    Either bound may be ``None`` (no bound).  Runs in one transaction that keeps concurrent
    writers of the rollup waiting (SQLite's write lock; a table lock on PostgreSQL), so a record
    written meanwhile is either read here or added after: never lost, never counted twice.
    Returns the number of rows written.
    """
    with transaction.atomic():
        if connection.vendor == "postgresql":
            table = connection.ops.quote_name(DailyUsage._meta.db_table)
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
        rows = DailyUsage.objects.all()
        records = UsageRecord.objects.filter(api_key__isnull=False).order_by()
        if first is not None:
            rows = rows.filter(day__gte=first)
            records = records.filter(created_at__gte=midnight(first))
        if last is not None:
            rows = rows.filter(day__lte=last)
            records = records.filter(created_at__lt=midnight(last + timedelta(days=1)))
        rows.delete()
        totals: dict[tuple[int, str, date], dict[str, int]] = {}
        fields = (
            "api_key_id",
            "model",
            "created_at",
            "status_code",
            "prompt_tokens",
            "completion_tokens",
            "cost_nanos",
            "latency_ms",
            "time_to_first_token_ms",
        )
        for record in records.only(*fields).iterator(chunk_size=2000):
            key_id = record.api_key_id
            assert key_id is not None, "records are filtered on api_key__isnull=False"
            row = totals.setdefault(
                (key_id, record.model, usage_day(record.created_at)), dict.fromkeys(ROLLUP_FIELDS, 0)
            )
            for name, value in rollup_increments(record).items():
                row[name] += value
        DailyUsage.objects.bulk_create(
            [
                DailyUsage(api_key_id=key_id, model=model, day=day, **row)
                for (key_id, model, day), row in totals.items()
            ],
            batch_size=1000,
        )
    return len(totals)


def month_tokens(
    month: str, *, api_key_ids: Iterable[int] | None = None, owner_ids: Iterable[int] | None = None
) -> dict[int, int]:
    """Month-to-date tokens: prompt plus completion tokens of the usage records created in ``month``.

    ``month`` is ``"YYYY-MM"`` (UTC, :func:`keys.periods.month_name`).  Returns
    ``{api_key_id: tokens}`` for ``api_key_ids``, or ``{owner_id: tokens}`` for ``owner_ids``
    (exactly one of them), leaving out ids without records.  The one definition the monthly quota,
    the account pages and the staff's accounts list share; one indexed query
    (``keys_usage_key_time`` or ``keys_usage_owner_time``).
    """
    if (api_key_ids is None) == (owner_ids is None):
        raise TypeError("month_tokens() takes exactly one of api_key_ids and owner_ids")
    first, following = month_bounds(month)
    records = UsageRecord.objects.filter(created_at__gte=midnight(first), created_at__lt=midnight(following))
    if api_key_ids is not None:
        group, records = "api_key_id", records.filter(api_key_id__in=list(api_key_ids))
    else:
        group, records = "owner_id", records.filter(owner_id__in=list(owner_ids or ()))
    rows = records.values_list(group).annotate(tokens=models.Sum("total_tokens")).order_by()
    return {ident: tokens or 0 for ident, tokens in rows}


def spend_nanos(period: str, *, api_key_id: int | None = None, owner_id: int | None = None) -> int:
    """The cost, in nanos, of the usage records of the key ``api_key_id`` or of the user ``owner_id``
    (exactly one) in the budget period named ``period`` (:func:`keys.periods.budget_period_name`):
    what a money budget's counter starts from."""
    if (api_key_id is None) == (owner_id is None):
        raise TypeError("spend_nanos() takes exactly one of api_key_id and owner_id")
    start, end = budget_period_bounds(period)
    records = (
        UsageRecord.objects.filter(api_key_id=api_key_id)
        if api_key_id
        else UsageRecord.objects.filter(owner_id=owner_id)
    )
    if start is not None:
        records = records.filter(created_at__gte=start)
    if end is not None:
        records = records.filter(created_at__lt=end)
    return records.aggregate(spent=models.Sum("cost_nanos"))["spent"] or 0
