"""API keys (a public prefix plus a SHA-256 hash of a high-entropy secret) and usage records.

A key's plaintext is ``sk-cs-{prefix}.{secret}``: ``prefix`` is 8 characters of ``[A-Za-z0-9]``,
stored in clear and unique, so a presented key is found with one indexed lookup; ``secret`` is
``secrets.token_urlsafe(32)`` (256 bits).  Only ``sha256(plaintext)`` is stored.  A fast hash is
enough because the secret is random, not a human password, and a password hasher (PBKDF2) would
slow every request (docs/performance.md#keys-usage-records-and-the-database).

Revocation is one-way: :meth:`APIKey.revoke` sets ``revoked_at`` once and ``save()`` refuses to
clear it.

Each key may carry its own limits (requests and tokens per minute, concurrent requests, tokens per
calendar month), a list of the models it may use, and requests and tokens per minute for each model
(``model_limits``); an empty limit means the global default (``API_DEFAULT_*`` settings), and 0
means no limit.  ``keys.limits`` enforces them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Q
from django.utils import timezone

from .errors import TooManyKeys
from .periods import usage_day
from .signals import api_key_revoked

KEY_NAMESPACE = "sk-cs-"
PREFIX_LENGTH = 8
PREFIX_ALPHABET = string.ascii_letters + string.digits
SECRET_BYTES = 32
# The secret part is whatever token_urlsafe produces; its length is not pinned so that a future
# change of SECRET_BYTES keeps old keys valid.  The bound only refuses absurd input early.
_KEY_PATTERN = re.compile(
    rf"{re.escape(KEY_NAMESPACE)}(?P<prefix>[A-Za-z0-9]{{{PREFIX_LENGTH}}})\.[A-Za-z0-9_-]{{1,256}}"
)
# Fresh prefixes collide with probability ~n/62**8; a few retries make a failure practically
# impossible while still surfacing a real constraint problem.
_PREFIX_ATTEMPTS = 5


def generate_prefix() -> str:
    """A random public prefix: ``PREFIX_LENGTH`` characters of ``[A-Za-z0-9]``."""
    return "".join(secrets.choice(PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))


def generate_plaintext(prefix: str, namespace: str = KEY_NAMESPACE) -> str:
    """``{namespace}{prefix}.{secret}`` with a fresh 256-bit secret."""
    return f"{namespace}{prefix}.{secrets.token_urlsafe(SECRET_BYTES)}"


def insert_with_fresh_prefix(manager: models.Manager, key: models.Model, namespace: str = KEY_NAMESPACE) -> str:
    """Give the unsaved ``key`` (a model with ``prefix`` and ``hashed_key``) a fresh prefix and
    secret, insert it through ``manager``, and return the plaintext.

    A prefix collision (a chance of about n/62**8) is retried; raises ``IntegrityError`` for any
    other database problem.  Used by API keys and the Administration API's admin keys.
    """
    for attempt in range(_PREFIX_ATTEMPTS):
        key.prefix = generate_prefix()
        plaintext = generate_plaintext(key.prefix, namespace)
        key.hashed_key = hash_key(plaintext)
        try:
            # The savepoint keeps a collision from breaking an enclosing transaction.
            with transaction.atomic(using=manager.db):
                key.save(force_insert=True, using=manager.db)
            return plaintext
        except IntegrityError:
            collided = manager.filter(prefix=key.prefix).exists()
            if not collided or attempt == _PREFIX_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def hash_key(plaintext: str) -> str:
    """The stored form of a key: the SHA-256 hex digest (64 characters) of the whole plaintext."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


_NO_LIMIT = "0: no limit."
# When a money budget's spend starts again (keys.periods.budget_period_name).
BUDGET_PERIODS = [("monthly", "Each calendar month (UTC)"), ("daily", "Each day (UTC)"), ("never", "Never")]


def parse_model_list(text: str) -> list[str]:
    """``"a, b,,c"`` → ``["a", "b", "c"]``: the model ids of an ``allowed_models`` value."""
    return [model.strip() for model in text.split(",") if model.strip()]


def validate_model_list(text: str) -> None:
    """Refuse model ids with spaces inside (a sign of a missing comma)."""
    for model in parse_model_list(text):
        if any(char.isspace() for char in model):
            raise ValidationError(f"“{model}” is not a model id; separate model ids with commas.")


# A key's own limits for one model: requests and tokens per minute (0: none), beside its limits over all models.
MODEL_LIMIT_NAMES = ("rpm", "tpm")
MAX_RPM = 2**31 - 1
MAX_TPM = 2**63 - 1


def validate_model_limits(value: Any) -> None:
    """Refuse a ``model_limits`` value that is not ``{"<model id>": {"rpm": n, "tpm": n}, ...}``
    (whole numbers of 0 or more, either may be left out); the message names the model and the limit."""
    if not isinstance(value, dict):
        raise ValidationError('Write the limits per model as {"model-id": {"rpm": 100, "tpm": 50000}}.')
    for model, limits in value.items():
        if not model or len(model) > 200 or any(char.isspace() or char == "," for char in model):
            raise ValidationError(f"“{model}” is not a model id.")
        if not isinstance(limits, dict):
            raise ValidationError(f"The limits of “{model}” must be an object with rpm and tpm.")
        for name, number in limits.items():
            if name not in MODEL_LIMIT_NAMES:
                raise ValidationError(f"“{name}” (for “{model}”) is not a limit: use rpm and tpm.")
            most = MAX_RPM if name == "rpm" else MAX_TPM
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= most:
                raise ValidationError(f"The {name} of “{model}” must be a whole number from 0 to {most}.")


def parse_prefix(plaintext: str) -> str | None:
    """The prefix of a well-formed key, or ``None`` when ``plaintext`` is not shaped like a key."""
    match = _KEY_PATTERN.fullmatch(plaintext)
    return match["prefix"] if match else None


class APIKeyQuerySet(models.QuerySet):
    """Status filters shared by the admin and the commands; "now" is evaluated per call."""

    def revoked(self) -> APIKeyQuerySet:
        return self.filter(revoked_at__isnull=False)

    def expired(self) -> APIKeyQuerySet:
        """Keys past their expiry that are not revoked (revoked wins, as in ``APIKey.status``)."""
        return self.filter(revoked_at__isnull=True, expires_at__lte=timezone.now())

    def active(self) -> APIKeyQuerySet:
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()), revoked_at__isnull=True)


class APIKeyManager(models.Manager.from_queryset(APIKeyQuerySet)):
    """Creates keys; the plaintext exists only in the return value of :meth:`create_key`."""

    def create_key(
        self, *, name: str, owner: models.Model, expires_at: datetime | None = None, **fields: Any
    ) -> tuple[APIKey, str]:
        """Insert a new key for ``owner`` and return ``(row, plaintext)``.

        ``fields`` are other fields of the key: its limits and ``allowed_models``.  The
        plaintext is not stored anywhere; show it to the user once.  Raises ``IntegrityError``
        for database problems other than a (retried) prefix collision.
        """
        api_key = self.model(name=name, owner=owner, expires_at=expires_at, **fields)
        return api_key, self.issue(api_key)

    def issue(self, api_key: APIKey) -> str:
        """Give the unsaved ``api_key`` a fresh prefix and secret, insert it, return the plaintext.

        :meth:`create_key` is built on this; the admin calls it directly so that the form's own
        instance becomes the saved row.  Raises :class:`~keys.errors.TooManyKeys` when the owner
        already holds their cap of active keys (:func:`max_keys_of`); the owner's row is locked
        while counting, so concurrent creations cannot pass the cap together.
        """
        with transaction.atomic(using=self.db):
            owner_model = type(api_key).owner.field.related_model
            list(
                owner_model._default_manager.using(self.db)
                .select_for_update()
                .filter(pk=api_key.owner_id)
                .values_list("pk")
            )
            check_key_cap(api_key.owner_id, self.db)
            return insert_with_fresh_prefix(self, api_key)


class AbstractKey(models.Model):
    """What an API key and an admin key (:class:`organization.models.AdminAPIKey`) share: the hash of
    the whole plaintext, their lifetime (created, last used, expiry, one-way revocation) and the
    checks on them.  Each concrete key adds its ``name``, ``owner`` and public ``prefix``."""

    hashed_key = models.CharField(max_length=64, editable=False, help_text="SHA-256 hex of the whole key.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Leave empty for a key that never expires.")
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        abstract = True

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def status(self) -> str:
        """``"revoked"``, ``"expired"`` or ``"active"``; revocation wins over expiry."""
        if self.is_revoked:
            return "revoked"
        return "expired" if self.is_expired else "active"

    def verify(self, plaintext: str) -> bool:
        """Whether ``plaintext`` is this key, compared in constant time (status is not checked)."""
        return hmac.compare_digest(hash_key(plaintext), self.hashed_key)

    def revoke(self) -> bool:
        """Revoke the key now; ``False`` (and the first ``revoked_at`` kept) if it already was.

        The conditional UPDATE makes two concurrent revocations agree on one timestamp; only the
        one that revoked calls :meth:`on_revoked`.
        """
        if self.is_revoked:
            return False
        now = timezone.now()
        updated = type(self)._default_manager.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=now)
        if updated:
            self.revoked_at = now
            self.on_revoked()
        else:
            self.refresh_from_db(fields=["revoked_at"])
        return bool(updated)

    def on_revoked(self) -> None:
        """Called once, by the :meth:`revoke` that revoked the key; nothing to do by default."""


class APIKey(AbstractKey):
    """A Bearer credential owned by a user; see the module docstring for the key format."""

    name = models.CharField(max_length=100, help_text="What the key is for, e.g. “laptop” or “CI”.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    prefix = models.CharField(
        max_length=PREFIX_LENGTH,
        unique=True,
        db_index=True,
        editable=False,
        validators=[RegexValidator(rf"^[A-Za-z0-9]{{{PREFIX_LENGTH}}}$")],
        help_text="The public part of the key, after “sk-cs-”.",
    )
    rpm_limit = models.PositiveIntegerField(
        "requests per minute", null=True, blank=True, help_text=f"Empty: the default (API_DEFAULT_RPM). {_NO_LIMIT}"
    )
    tpm_limit = models.PositiveBigIntegerField(
        "tokens per minute",
        null=True,
        blank=True,
        help_text=f"Prompt plus completion tokens. Empty: the default (API_DEFAULT_TPM). {_NO_LIMIT}",
    )
    max_concurrent = models.PositiveIntegerField(
        "concurrent requests",
        null=True,
        blank=True,
        help_text=f"Requests in flight at once. Empty: the default (API_DEFAULT_MAX_CONCURRENT). {_NO_LIMIT}",
    )
    monthly_token_quota = models.PositiveBigIntegerField(
        "tokens per calendar month",
        null=True,
        blank=True,
        help_text=f"Empty: the default (API_DEFAULT_MONTHLY_TOKENS). {_NO_LIMIT}",
    )
    budget = models.DecimalField(
        "budget",
        max_digits=14,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Spend per budget period, in the currency of the model prices. "
        "Empty: the default (API_DEFAULT_BUDGET). 0: no budget.",
    )
    budget_period = models.CharField(
        max_length=10,
        choices=BUDGET_PERIODS,
        blank=True,
        help_text="When the budget's spend starts again. Empty: the default (API_DEFAULT_BUDGET_PERIOD).",
    )
    allowed_models = models.CharField(
        max_length=1000,
        blank=True,
        validators=[validate_model_list],
        help_text="Comma-separated model ids this key may use, e.g. “smollm2-135m-instruct”. Empty: all models.",
    )

    model_limits = models.JSONField(
        "limits per model",
        default=dict,
        blank=True,
        validators=[validate_model_limits],
        help_text="Requests and tokens per minute for one model, beside the limits over all models, e.g. "
        '{"llama-3.1-8b-instruct": {"rpm": 60, "tpm": 100000}}: model ids as usage names them (an alias counts '
        "as its model); a limit left out or 0: none of its own.",
    )

    objects = APIKeyManager()

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({KEY_NAMESPACE}{self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return not self.is_revoked and not self.is_expired

    @property
    def models(self) -> list[str]:
        """The model ids of ``allowed_models``; an empty list means every model."""
        return parse_model_list(self.allowed_models)

    def allows_model(self, model: str) -> bool:
        """Whether this key may use ``model`` (any model when ``allowed_models`` is empty)."""
        allowed = self.models
        return not allowed or model in allowed

    def limits_for_model(self, model: str) -> tuple[int, int] | None:
        """``(rpm, tpm)`` of the key's own limits for ``model`` (0: none), or ``None`` when it has none for it."""
        own = (self.model_limits or {}).get(model) if model else None
        if not own or not any(own.get(name) for name in MODEL_LIMIT_NAMES):
            return None
        return int(own.get("rpm") or 0), int(own.get("tpm") or 0)

    def own_model_limits(self) -> list[tuple[str, int, int]]:
        """``(model, rpm, tpm)`` for each model the key has limits of its own for (0: none), by model id."""
        found = ((model, self.limits_for_model(model)) for model in sorted(self.model_limits or {}))
        return [(model, *own) for model, own in found if own is not None]

    def with_model_limits(self, model: str, changes: dict[str, int | None]) -> dict[str, Any]:
        """``model_limits`` with ``model``'s limits changed by ``changes`` (``rpm``/``tpm``: a number,
        or ``None``/0 to remove it; the others kept), an entry left with none removed.  Raises
        ``ValidationError`` where ``model`` is not a model id."""
        validate_model_limits({model: {}})
        changed = dict((self.model_limits or {}).get(model) or {})
        changed.update({name: number or 0 for name, number in changes.items()})
        limits = {other: own for other, own in (self.model_limits or {}).items() if other != model}
        if kept := {name: number for name, number in changed.items() if number}:
            limits[model] = kept
        return limits

    def on_revoked(self) -> None:
        """Tell :data:`keys.signals.api_key_revoked`'s receivers (the audit log): once, by the revocation."""
        api_key_revoked.send(sender=type(self), api_key=self)

    def save(self, *args, **kwargs) -> None:
        """Save, refusing (``ValueError``) to clear the revocation of a revoked row."""
        if not self._state.adding and self.revoked_at is None:
            if type(self).objects.filter(pk=self.pk, revoked_at__isnull=False).exists():
                raise ValueError("A revoked API key cannot be reinstated; create a new key instead.")
        super().save(*args, **kwargs)


def max_keys_of(owner_id: int, using: str | None = None) -> int:
    """How many active keys the user may hold: their own cap, else ``API_USER_MAX_KEYS``; 0: no cap."""
    own = UserLimits.objects.using(using).filter(user_id=owner_id).values_list("max_keys", flat=True).first()
    return settings.API_USER_MAX_KEYS if own is None else own


def check_key_cap(owner_id: int, using: str | None = None) -> None:
    """Raise :class:`~keys.errors.TooManyKeys` if the user cannot take one more active key."""
    cap = max_keys_of(owner_id, using)
    if cap and APIKey.objects.using(using).filter(owner_id=owner_id).active().count() >= cap:
        raise TooManyKeys(cap)


class UserLimits(models.Model):
    """One user's own limits across all of their keys, beside each key's; an empty field means the
    default (``API_USER_DEFAULT_*``, ``API_USER_MAX_KEYS``), 0 means no limit.

    A user without a row has the defaults.  ``keys.limits`` counts a user's requests, tokens, month
    and spend over every one of their keys, atomically with the key's own counters.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="limits")
    rpm_limit = models.PositiveIntegerField(
        "requests per minute",
        null=True,
        blank=True,
        help_text=f"Over all the user's keys. Empty: the default (API_USER_DEFAULT_RPM). {_NO_LIMIT}",
    )
    tpm_limit = models.PositiveBigIntegerField(
        "tokens per minute",
        null=True,
        blank=True,
        help_text=f"Over all the user's keys. Empty: the default (API_USER_DEFAULT_TPM). {_NO_LIMIT}",
    )
    max_concurrent = models.PositiveIntegerField(
        "concurrent requests",
        null=True,
        blank=True,
        help_text=f"Over all the user's keys. Empty: the default (API_USER_DEFAULT_MAX_CONCURRENT). {_NO_LIMIT}",
    )
    monthly_token_quota = models.PositiveBigIntegerField(
        "tokens per calendar month",
        null=True,
        blank=True,
        help_text=f"Over all the user's keys. Empty: the default (API_USER_DEFAULT_MONTHLY_TOKENS). {_NO_LIMIT}",
    )
    budget = models.DecimalField(
        max_digits=14,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Spend per budget period over all the user's keys, in the currency of the model prices. "
        "Empty: the default (API_USER_DEFAULT_BUDGET). 0: no budget.",
    )
    budget_period = models.CharField(
        max_length=10,
        choices=BUDGET_PERIODS,
        blank=True,
        help_text="When the budget's spend starts again. Empty: the default (API_USER_DEFAULT_BUDGET_PERIOD).",
    )
    max_keys = models.PositiveIntegerField(
        "active keys",
        null=True,
        blank=True,
        help_text="API keys the user may hold at once (revoked and expired ones do not count). "
        "Empty: the default (API_USER_MAX_KEYS). 0: no cap.",
    )

    class Meta:
        verbose_name = "user limits"
        verbose_name_plural = "user limits"

    def __str__(self) -> str:
        return f"limits of user {self.user_id}"


class ModelPrice(models.Model):
    """What a model's tokens cost, per million, in one currency (USD by convention).

    A usage record's cost is computed from these when it is written (``keys.pricing``); a model
    without a row costs nothing.  A price change applies to requests admitted after it (each
    process reads the table again within ``keys.pricing.CACHE_SECONDS``).
    """

    model = models.CharField(max_length=200, unique=True, help_text="The served model id, as usage records name it.")
    prompt_per_million = models.DecimalField(
        "prompt tokens, per million", max_digits=12, decimal_places=4, validators=[MinValueValidator(0)]
    )
    completion_per_million = models.DecimalField(
        "completion tokens, per million", max_digits=12, decimal_places=4, validators=[MinValueValidator(0)]
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model"]

    def __str__(self) -> str:
        return f"{self.model}: {self.prompt_per_million} / {self.completion_per_million} per million tokens"


class UsageRecord(models.Model):
    """One API request: who made it, with which key, what it cost and how it ended.

    ``request_id`` is the response ``id`` (e.g. ``cmpl-...``) and the ``x-request-id`` header.
    ``finish_reason`` lists the choices' reasons comma-separated (``"stop,length"``), or
    ``"interrupted"``/``"error"``.  Rows outlive their key and owner (``SET_NULL``) so that
    accounting survives deletions.
    """

    api_key = models.ForeignKey(APIKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage_records")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage_records"
    )
    model = models.CharField(max_length=200)
    request_id = models.CharField(max_length=100, unique=True)
    endpoint = models.CharField(max_length=100, default="/v1/completions")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveIntegerField(default=0)
    cost_nanos = models.PositiveBigIntegerField(
        "cost", default=0, help_text="In billionths of the prices' currency (keys.pricing), at the request's prices."
    )
    stream = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField()
    finish_reason = models.CharField(max_length=255, blank=True)
    error_type = models.CharField(max_length=100, blank=True)
    latency_ms = models.FloatField()
    time_to_first_token_ms = models.FloatField(null=True, blank=True)
    user = models.CharField(max_length=256, blank=True, help_text="The request's OpenAI “user” field.")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        # Per-key and per-owner windows ("tokens this month") scan by key/owner, then time.
        indexes = [
            models.Index(fields=["api_key", "created_at"], name="keys_usage_key_time"),
            models.Index(fields=["owner", "created_at"], name="keys_usage_owner_time"),
        ]

    def __str__(self) -> str:
        return self.request_id


class DailyUsageQuerySet(models.QuerySet):
    def add(self, record: UsageRecord) -> None:
        """Add ``record`` to its day's row (created on first use), with increments, not a read-modify-write.

        Call it inside the transaction that inserts ``record``, so that the rollup and the records
        never disagree.  Concurrent writers are safe: the UPDATE takes the row lock, and when two
        writers both create the day's row the loser's INSERT fails on the unique constraint
        (inside a savepoint) and it falls back to the UPDATE.
        """
        if record.api_key_id is None:
            return
        row = {"api_key_id": record.api_key_id, "model": record.model, "day": usage_day(record.created_at)}
        increments = rollup_increments(record)
        if self._increment(row, increments):
            return
        try:
            with transaction.atomic(using=self.db):
                self.create(**row, **increments)
        except IntegrityError:
            self._increment(row, increments)

    def _increment(self, row: dict[str, Any], increments: dict[str, int]) -> int:
        """``UPDATE ... SET f = f + %s ... WHERE`` the ``row``; returns the rows changed (0 or 1).

        The statement is written here, not by ``update(f=F(f) + n)``: Django compiles that anew per
        call, once per API request (docs/performance.md#keys-usage-records-and-the-database)."""
        connection = connections[self._db or router.db_for_write(self.model)]  # a write, as update() routes it
        quote = connection.ops.quote_name
        fields = {field.attname: field for field in self.model._meta.concrete_fields}
        column = {name: quote(field.column) for name, field in fields.items()}
        assignments = ", ".join(f"{column[name]} = {column[name]} + %s" for name in increments)
        where = " AND ".join(f"{column[name]} = %s" for name in row)
        values = [
            *increments.values(),
            *(fields[name].get_db_prep_value(value, connection) for name, value in row.items()),
        ]
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {quote(self.model._meta.db_table)} SET {assignments} WHERE {where}", values)
            return cursor.rowcount


class DailyUsage(models.Model):
    """Usage per key, model and UTC day, kept in step with the usage records.

    Each record adds to its row in the transaction that inserts it (:meth:`DailyUsageQuerySet.add`);
    ``manage.py rebuild_usage_rollup`` recomputes rows from the records.  Both use
    :func:`rollup_increments`, and every figure is an integer (latencies are summed in whole
    milliseconds), so a rebuild reproduces the rows exactly, whatever the order of the records.
    ``errors`` counts statuses of 400 and above other than 429; 429s are ``rate_limited``.  Rows
    go with their key (records stay, see :class:`UsageRecord`).
    """

    api_key = models.ForeignKey(APIKey, on_delete=models.CASCADE, related_name="daily_usage")
    model = models.CharField(max_length=200)
    day = models.DateField(help_text="The UTC date of the records.")
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0, help_text="Status 400 and above, 429 excepted.")
    rate_limited = models.PositiveBigIntegerField(default=0, help_text="Status 429: limits and quota.")
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cost_nanos = models.PositiveBigIntegerField("cost", default=0, help_text="In billionths of the prices' currency.")
    latency_ms_sum = models.PositiveBigIntegerField(default=0, help_text="Sum of whole milliseconds.")
    first_token_requests = models.PositiveBigIntegerField(
        default=0, help_text="Requests with a time to first token (those that produced a token)."
    )
    time_to_first_token_ms_sum = models.PositiveBigIntegerField(default=0, help_text="Sum of whole milliseconds.")

    objects = DailyUsageQuerySet.as_manager()

    class Meta:
        verbose_name = "daily usage"
        verbose_name_plural = "daily usage"
        ordering = ["-day", "api_key", "model"]
        constraints = [models.UniqueConstraint(fields=["api_key", "model", "day"], name="keys_dailyusage_unique_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.model} key {self.api_key_id}"


ROLLUP_FIELDS = (
    "requests",
    "errors",
    "rate_limited",
    "prompt_tokens",
    "completion_tokens",
    "cost_nanos",
    "latency_ms_sum",
    "first_token_requests",
    "time_to_first_token_ms_sum",
)


# What counts as an error, once for the rollup, the dashboard and the account pages: a status of
# 400 and above other than 429; a 429 (a limit or the quota) is "rate limited", counted apart.
ERROR_STATUS = models.Q(status_code__gte=400) & ~models.Q(status_code=429)
RATE_LIMITED_STATUS = models.Q(status_code=429)


def is_error(status_code: int) -> bool:
    """Whether a response with ``status_code`` counts as an error (see ``ERROR_STATUS``)."""
    return status_code >= 400 and status_code != 429


def rollup_increments(record: UsageRecord) -> dict[str, int]:
    """What one usage record adds to its :class:`DailyUsage` row, field by field."""
    first_token = record.time_to_first_token_ms
    return {
        "requests": 1,
        "errors": int(is_error(record.status_code)),
        "rate_limited": int(record.status_code == 429),
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "cost_nanos": record.cost_nanos,
        "latency_ms_sum": round(record.latency_ms),
        "first_token_requests": int(first_token is not None),
        "time_to_first_token_ms_sum": 0 if first_token is None else round(first_token),
    }
