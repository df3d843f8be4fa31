"""What the limits decide: a key's limits in force, and a counter store's answer.

Pure values; the stores (``local.py``, ``redis.py``) produce :class:`Decision`, the limiter
(``limiter.py``) raises :class:`~keys.errors.LimitRefused` carrying one, and the API turns it into
a 429 with OpenAI's ``x-ratelimit-*`` headers (``api/translate.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from django.conf import settings

if TYPE_CHECKING:
    from keys.models import APIKey

# The sliding window of the per-minute limits; read at each call (a test shortens it).
WINDOW_MS = 60_000
# Refusals, in the order they are checked.
QUOTA, TOO_LARGE, CONCURRENCY, REQUESTS, TOKENS = "quota", "too_large", "concurrency", "requests", "tokens"
REFUSALS: Final = (None, QUOTA, TOO_LARGE, CONCURRENCY, REQUESTS, TOKENS)  # as numbered by acquire.lua


@dataclass(frozen=True)
class Limits:
    """A key's effective limits; 0 means no limit.

    ``rpm`` requests and ``tpm`` tokens in any 60 seconds, ``max_concurrent`` requests in flight,
    ``monthly_tokens`` tokens per calendar month (UTC).
    """

    rpm: int = 0
    tpm: int = 0
    max_concurrent: int = 0
    monthly_tokens: int = 0

    @classmethod
    def of(cls, api_key: APIKey) -> Limits:
        """The key's own limits, with the ``API_DEFAULT_*`` settings where it has none."""

        def pick(own: int | None, default: int) -> int:
            return default if own is None else own

        return cls(
            rpm=pick(api_key.rpm_limit, settings.API_DEFAULT_RPM),
            tpm=pick(api_key.tpm_limit, settings.API_DEFAULT_TPM),
            max_concurrent=pick(api_key.max_concurrent, settings.API_DEFAULT_MAX_CONCURRENT),
            monthly_tokens=pick(api_key.monthly_token_quota, settings.API_DEFAULT_MONTHLY_TOKENS),
        )


@dataclass(frozen=True)
class Decision:
    """A counter store's answer: the refusal (``None`` if admitted) and the key's usage.

    ``requests`` and ``tokens`` are the last 60 seconds' counts (this request included when
    admitted), ``concurrent`` the requests in flight, ``month_tokens`` the month's tokens (-1 when
    unknown).  The ``*_ms`` figures are waits in milliseconds: until every counted request (token)
    has left the window, and until this request would be admitted.
    """

    refusal: str | None
    requests: int
    tokens: int
    concurrent: int
    month_tokens: int
    reset_requests_ms: int
    reset_tokens_ms: int
    retry_after_ms: int = 0


class MonthUnknown(Exception):
    """The store has no counter for the key's month yet: seed it from the database, then retry."""


class StoreUnavailable(Exception):
    """The shared store (Redis) did not answer."""
