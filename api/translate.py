"""The domain's errors and decisions in HTTP: statuses, OpenAI's errors and ``x-ratelimit-*`` headers.

``keys`` raises :class:`~keys.errors.AuthFailed`, :class:`~keys.errors.LimitRefused`,
:class:`~keys.errors.LimiterUnavailable` and :class:`~keys.errors.DatabaseUnavailable` and reports :class:`~keys.limits.Decision` values; this
module is the one place that says what OpenAI's API answers for each (the messages, types and
codes of OpenAI's own 401s and 429s, and its rate-limit headers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal

from keys import journal
from keys.errors import AuthFailed, DatabaseUnavailable, LimiterUnavailable, LimitRefused
from keys.limits import BUDGET, CONCURRENCY, KEY, MODEL, QUOTA, REQUESTS, TOO_LARGE, USER, Decision, Scope
from keys.periods import DAILY, MONTHLY, NEVER, budget_period_bounds, month_bounds
from keys.pricing import to_money

from .errors import APIError

MISSING_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
INCORRECT_KEY_MESSAGE = "Incorrect API key provided."
# RFC 9110 requires a challenge on every 401; "Bearer" never makes a browser prompt for a password.
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class LimitExceeded(APIError):
    """A 429: ``rate_limit_exceeded`` (``type`` requests or tokens) or ``insufficient_quota``."""


def auth_error(error: AuthFailed) -> APIError:
    """OpenAI's 401: ``code: null`` for a missing credential, ``invalid_api_key`` for any bad key
    (the same for every one, never echoing the key)."""
    if error.missing:
        return APIError(MISSING_KEY_MESSAGE, status=401, code=None, headers=_CHALLENGE)
    return APIError(INCORRECT_KEY_MESSAGE, status=401, code="invalid_api_key", headers=_CHALLENGE)


def _unavailable(message: str, code: str | None, retry_after: float | int) -> APIError:
    """A 503 ``server_error`` that tells the client when to retry."""
    return APIError(message, status=503, type="server_error", code=code, headers={"Retry-After": str(retry_after)})


def limiter_error(error: LimiterUnavailable) -> APIError:
    """The 503 when the limits cannot be checked (``limiter_unavailable`` when failing closed)."""
    if error.closed:
        return _unavailable(
            "The rate limiter is unavailable, so requests are refused for now; try again shortly.",
            "limiter_unavailable",
            error.retry_after_seconds,
        )
    return _unavailable("The rate limiter could not count this request; try again.", None, error.retry_after_seconds)


def database_error(error: DatabaseUnavailable) -> APIError:
    """The 503 while the database does not answer: nothing was served or charged; retry."""
    return _unavailable(
        "The server cannot reach its database right now; retry the request shortly.",
        "database_unavailable",
        error.retry_after_seconds,
    )


def journal_error() -> APIError:
    """The 503 while the usage journal cannot be written (a full disk): nothing could be accounted for."""
    return _unavailable(
        "The server cannot record usage right now; retry the request shortly.",
        "usage_journal_unavailable",
        journal.RETRY_AFTER_SECONDS,
    )


def format_duration(ms: int) -> str:
    """A wait as OpenAI writes it (Go's duration format): ``17ms``, ``1.5s``, ``1m0s``, ``6m0s``."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


# Where a limit applies, as a 429's message says it.
WHERE = {KEY: "on this API key", USER: "on your account (all of its API keys together)"}


def where(scope: Scope) -> str:
    """Where ``scope``'s limit applies, in a 429's words: ``on this API key``, ``on your account
    (...)``, or ``for <model> on this API key`` (the key's limits for one model, as OpenAI's
    messages name the model)."""
    if scope.kind == MODEL:
        return f"for {scope.model} on this API key"
    return WHERE[scope.kind]


PERIODS = {MONTHLY: "per calendar month", DAILY: "per day", NEVER: "in all"}


def rate_limit_headers(scopes: Sequence[Scope], decision: Decision) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers; for each dimension the scope (the key, the user, or the key
    for the request's model) with the least remaining; a dimension without a limit in any scope has none."""
    headers: dict[str, str] = {}
    dimensions = []
    for name, limit_of, used_of, reset_of in (
        ("requests", lambda lim: lim.rpm, lambda u: u.requests, lambda u: u.reset_requests_ms),
        ("tokens", lambda lim: lim.tpm, lambda u: u.tokens, lambda u: u.reset_tokens_ms),
    ):
        limited = [
            (limit_of(scope.limits), used_of(usage), reset_of(usage))
            for scope, usage in zip(scopes, decision.usages, strict=True)
            if limit_of(scope.limits)
        ]
        if limited:
            limit, used, reset = min(limited, key=lambda entry: entry[0] - entry[1])
            dimensions.append((name, limit, used, reset))
    for name, limit, _, _ in dimensions:
        headers[f"x-ratelimit-limit-{name}"] = str(limit)
    for name, limit, used, _ in dimensions:
        headers[f"x-ratelimit-remaining-{name}"] = str(max(0, limit - used))
    for name, _, _, reset in dimensions:
        headers[f"x-ratelimit-reset-{name}"] = format_duration(reset)
    return headers


def limit_error(refused: LimitRefused) -> LimitExceeded:
    """OpenAI's 429 for a refusal, naming the limit and whether it is the key's, the user's or the
    key's for the model, with its rate-limit headers and when (or whether) to retry."""
    decision, scope, tokens = refused.decision, refused.scope, refused.tokens
    limits, place = scope.limits, where(scope)
    headers = rate_limit_headers(refused.scopes, decision)
    wait = decision.retry_after_ms
    retry = {"Retry-After": str(max(1, math.ceil(wait / 1000))), "retry-after-ms": str(max(1, wait))}
    final = {"x-should-retry": "false"}  # the official clients retry every 429 unless told not to
    whose = "this API key" if scope.kind == KEY else "your account (all of its API keys together)"
    if decision.refusal == QUOTA:
        _, renewal = month_bounds(scope.month)
        return LimitExceeded(
            f"You exceeded your current quota: {whose} may use {limits.monthly_tokens} tokens per calendar "
            f"month, {decision.month_tokens} are used and this request needs up to {tokens} (prompt tokens plus "
            f"max_tokens for each choice). The quota renews on {renewal.isoformat()} (UTC).",
            status=429,
            type="insufficient_quota",
            code="insufficient_quota",
            headers={**headers, **final},
        )
    if decision.refusal == BUDGET:
        _, period_end = budget_period_bounds(scope.budget_window)
        renews = f" The budget renews on {period_end.date().isoformat()} (UTC)." if period_end else ""
        return LimitExceeded(
            f"You exceeded your current quota: the budget of {whose} is {_money(limits.budget)} USD "
            f"{PERIODS.get(limits.budget_period, '')}, {_money(decision.spend)} USD is spent and this request may "
            f"cost up to {_money(refused.cost)} USD (prompt tokens plus max_tokens for each choice, at the "
            f"model's prices).{renews}",
            status=429,
            type="insufficient_quota",
            code="insufficient_quota",
            headers={**headers, **final},
        )
    if decision.refusal == TOO_LARGE:
        return LimitExceeded(
            f"Request too large for tokens per min (TPM) {place}: Limit {limits.tpm}, Requested {tokens}. "
            "Reduce the prompt or max_tokens (each choice reserves max_tokens) to run it.",
            status=429,
            type="tokens",
            code="rate_limit_exceeded",
            headers={**headers, **final},
        )
    if decision.refusal == CONCURRENCY:
        return LimitExceeded(
            f"Rate limit reached for concurrent requests {place}: Limit {limits.max_concurrent}, "
            f"Used {decision.concurrent}, Requested 1. Please try again once one of them has finished.",
            status=429,
            type="requests",
            code="rate_limit_exceeded",
            headers={**headers, **retry},
        )
    if decision.refusal == REQUESTS:
        name, limit, used, requested = "requests per min (RPM)", limits.rpm, decision.requests, 1
    else:
        name, limit, used, requested = "tokens per min (TPM)", limits.tpm, decision.tokens, tokens
    return LimitExceeded(
        f"Rate limit reached for {name} {place}: Limit {limit}, Used {used}, Requested {requested}. "
        f"Please try again in {format_duration(wait)}.",
        status=429,
        type=str(decision.refusal),
        code="rate_limit_exceeded",
        headers={**headers, **retry},
    )


def _money(nanos: int) -> str:
    """Nanos as an amount of money: at least two decimals, more only where they are not zero."""
    amount = to_money(max(0, nanos))
    return f"{amount:.2f}" if amount == amount.quantize(Decimal("0.01")) else f"{amount:f}"
