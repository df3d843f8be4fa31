"""What the limits decide: the scopes a request is counted in, their limits, and a store's answer.

Pure values; the stores (``local.py``, ``redis.py``) produce :class:`Decision`, the limiter
(``limiter.py``) raises :class:`~keys.errors.LimitRefused` carrying one, and the API turns it into
a 429 with OpenAI's ``x-ratelimit-*`` headers (``api/translate.py``).

A request is counted in two scopes: its API key's and its user's (all of the user's keys together),
and in a third where the key has limits of its own for the request's model (``APIKey.model_limits``:
requests and tokens per minute of that key for that model).  Each :class:`Scope` has its own
:class:`Limits` and counters; a request is admitted only when all allow it, and then counted in
all, in one atomic step.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from django.conf import settings

if TYPE_CHECKING:
    from keys.models import APIKey, UserLimits

# The sliding window of the per-minute limits; read at each call (a test shortens it).
WINDOW_MS = 60_000
# Refusals, in the order they are checked (each over every scope before the next).
QUOTA, BUDGET, TOO_LARGE, CONCURRENCY, REQUESTS, TOKENS = (
    "quota",
    "budget",
    "too_large",
    "concurrency",
    "requests",
    "tokens",
)
REFUSALS: Final = (None, QUOTA, BUDGET, TOO_LARGE, CONCURRENCY, REQUESTS, TOKENS)  # as numbered by acquire.lua
# Whose counters a scope holds: a key's, a user's, or a key's for one model.
KEY, USER, MODEL = "key", "user", "model"


def _pick(own: int | None, default: int) -> int:
    return default if own is None else own


def _nanos(amount: Decimal | None, default: Decimal) -> int:
    from keys.pricing import to_nanos

    return to_nanos(default if amount is None else amount)


@dataclass(frozen=True)
class Limits:
    """A key's or a user's effective limits; 0 means no limit.

    ``rpm`` requests and ``tpm`` tokens in any 60 seconds, ``max_concurrent`` requests in flight,
    ``monthly_tokens`` tokens per calendar month (UTC), ``budget`` nanos of spend
    (:mod:`keys.pricing`) per ``budget_period`` (``monthly``, ``daily`` or ``never``).
    """

    rpm: int = 0
    tpm: int = 0
    max_concurrent: int = 0
    monthly_tokens: int = 0
    budget: int = 0
    budget_period: str = "monthly"

    @classmethod
    def of(cls, api_key: APIKey) -> Limits:
        """The key's own limits, with the ``API_DEFAULT_*`` settings where it has none."""
        return cls(
            rpm=_pick(api_key.rpm_limit, settings.API_DEFAULT_RPM),
            tpm=_pick(api_key.tpm_limit, settings.API_DEFAULT_TPM),
            max_concurrent=_pick(api_key.max_concurrent, settings.API_DEFAULT_MAX_CONCURRENT),
            monthly_tokens=_pick(api_key.monthly_token_quota, settings.API_DEFAULT_MONTHLY_TOKENS),
            budget=_nanos(api_key.budget, settings.API_DEFAULT_BUDGET),
            budget_period=api_key.budget_period or settings.API_DEFAULT_BUDGET_PERIOD,
        )

    @classmethod
    def of_model(cls, api_key: APIKey, model: str) -> Limits | None:
        """The key's own requests and tokens per minute for ``model`` (its ``model_limits``; no
        default), or ``None`` when it has none for it."""
        own = api_key.limits_for_model(model)
        return None if own is None else cls(rpm=own[0], tpm=own[1])

    @classmethod
    def of_user(cls, own: UserLimits | None) -> Limits:
        """A user's limits (``own``: their :class:`~keys.models.UserLimits`, ``None`` when they have
        none), with the ``API_USER_DEFAULT_*`` settings where they have none."""
        if own is None:
            from keys.models import UserLimits

            own = UserLimits()  # every field empty: the defaults
        return cls(
            rpm=_pick(own.rpm_limit, settings.API_USER_DEFAULT_RPM),
            tpm=_pick(own.tpm_limit, settings.API_USER_DEFAULT_TPM),
            max_concurrent=_pick(own.max_concurrent, settings.API_USER_DEFAULT_MAX_CONCURRENT),
            monthly_tokens=_pick(own.monthly_token_quota, settings.API_USER_DEFAULT_MONTHLY_TOKENS),
            budget=_nanos(own.budget, settings.API_USER_DEFAULT_BUDGET),
            budget_period=own.budget_period or settings.API_USER_DEFAULT_BUDGET_PERIOD,
        )


@dataclass(frozen=True)
class Scope:
    """One set of counters a request counts in: an API key's (``kind`` :data:`KEY`), a user's
    (:data:`USER`) or an API key's for one ``model`` (:data:`MODEL`), ``id`` the key's or the user's
    primary key, with its ``limits``.

    ``owner_id`` is the user the counters belong to (the key's owner, or the user): the Redis store
    keeps a request's scopes together under it.  ``month`` names the monthly quota's counter
    (``"YYYY-MM"``), ``budget_window`` the budget's (:func:`keys.periods.budget_period_name`).
    """

    kind: str
    id: int
    owner_id: int
    limits: Limits
    month: str
    budget_window: str
    model: str = ""  # the model of a MODEL scope

    @property
    def name(self) -> str:
        """``"key:7"``, ``"user:3"`` or ``"model:7:big"``: the scope's counters' name in a store."""
        return f"{self.kind}:{self.id}:{self.model}" if self.kind == MODEL else f"{self.kind}:{self.id}"


@dataclass(frozen=True)
class Usage:
    """One scope's counts as a store saw them.

    ``requests`` and ``tokens`` are the last 60 seconds' counts (this request included when
    admitted), ``concurrent`` the requests in flight, ``month_tokens`` the month's tokens and
    ``spend`` the budget period's nanos (-1 when unknown).  ``reset_*_ms``: the waits in
    milliseconds until every counted request (token) has left the window.
    """

    requests: int
    tokens: int
    concurrent: int
    month_tokens: int
    spend: int
    reset_requests_ms: int
    reset_tokens_ms: int


@dataclass(frozen=True)
class Decision:
    """A counter store's answer: the refusal (``None`` if admitted), the index of the scope that
    refused (``refused_by``), each scope's :class:`Usage` in the order asked, and the wait in
    milliseconds until this request would be admitted.

    ``requests``, ``tokens``, ... are those of the scope that refused, else of the first (the key).
    """

    refusal: str | None
    usages: tuple[Usage, ...]
    refused_by: int = 0
    retry_after_ms: int = 0

    @property
    def usage(self) -> Usage:
        return self.usages[self.refused_by]

    @property
    def requests(self) -> int:
        return self.usage.requests

    @property
    def tokens(self) -> int:
        return self.usage.tokens

    @property
    def concurrent(self) -> int:
        return self.usage.concurrent

    @property
    def month_tokens(self) -> int:
        return self.usage.month_tokens

    @property
    def spend(self) -> int:
        return self.usage.spend

    @property
    def reset_requests_ms(self) -> int:
        return self.usage.reset_requests_ms

    @property
    def reset_tokens_ms(self) -> int:
        return self.usage.reset_tokens_ms


class TotalsUnknown(Exception):
    """The store has no counter yet for a scope's month or budget period: seed them from the
    database (:meth:`~keys.limits.limiter.CounterStore.seed`), then retry."""


class StoreUnavailable(Exception):
    """The shared store (Redis) did not answer."""
