"""The limiter's Prometheus metrics: refusals by limit, store errors, fail-open periods.

Counted where the domain decides (:mod:`keys.limits.limiter`), so every caller's refusals count;
``completions_site/metrics.py`` exposes them with the engine's and the gateway's.  Names carry our
prefix ``completions_`` (see :mod:`inference.metrics`).
"""

from __future__ import annotations

from prometheus_client import Counter

from keys.limits.decision import CONCURRENCY, QUOTA, REQUESTS, TOKENS, TOO_LARGE

rate_limited = Counter(
    "completions_rate_limited",
    "Requests refused with a 429, by the limit that refused: requests (per minute), tokens (per minute, "
    "or larger than the whole limit), concurrency, quota (monthly).",
    ["limit"],
)
# A request larger than the whole per-minute token limit is a tokens refusal (its 429 says so).
LIMIT_LABELS = {QUOTA: "quota", TOO_LARGE: "tokens", CONCURRENCY: "concurrency", REQUESTS: "requests", TOKENS: "tokens"}
_refusals = {refusal: rate_limited.labels(limit=label) for refusal, label in LIMIT_LABELS.items()}

limiter_store_errors = Counter(
    "completions_limiter_store_errors",
    "Times the shared counter store (Redis) did not answer.",
)
limiter_fail_open_periods = Counter(
    "completions_limiter_fail_open_periods",
    "Periods of API_LIMITS_REDIS_RETRY_SECONDS that began with Redis down while failing open "
    "(each process then enforcing the limits alone).",
)
limiter_fail_open_requests = Counter(
    "completions_limiter_fail_open_requests",
    "Limit checks served by this process's own counters because Redis was down (fail open).",
)


def refused(refusal: str) -> None:
    """Count one 429 for ``refusal`` (a :mod:`keys.limits.decision` constant)."""
    _refusals[refusal].inc()
