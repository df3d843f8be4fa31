"""The domain's Prometheus metrics: the limiter's (refusals by limit, store errors, fail-open
periods) and the usage journal's (records waiting, its size, failures).

Counted where the domain decides (:mod:`keys.limits.limiter`, :mod:`keys.journal`), so every caller's count;
``completions_site/metrics.py`` exposes them with the engine's and the gateway's.  Names carry our
prefix ``completions_`` (see :mod:`inference.metrics`).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from keys.limits.decision import BUDGET, CONCURRENCY, QUOTA, REQUESTS, TOKENS, TOO_LARGE

rate_limited = Counter(
    "completions_rate_limited",
    "Requests refused with a 429, by the limit that refused: requests (per minute), tokens (per minute, "
    "or larger than the whole limit), concurrency, quota (monthly tokens), budget (money).",
    ["limit"],
)
# A request larger than the whole per-minute token limit is a tokens refusal (its 429 says so).
LIMIT_LABELS = {
    QUOTA: "quota",
    BUDGET: "budget",
    TOO_LARGE: "tokens",
    CONCURRENCY: "concurrency",
    REQUESTS: "requests",
    TOKENS: "tokens",
}
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


# --- The usage journal (keys/journal.py) --------------------------------------------------------
journal_records = Gauge(
    "completions_usage_journal_records",
    "Usage records in the process's journal that the database has not acknowledged yet.",
    multiprocess_mode="livesum",
)
journal_bytes = Gauge(
    "completions_usage_journal_bytes",
    "Size of the process's usage journal on disk (its SQLite file and write-ahead log).",
    multiprocess_mode="livesum",
)
journal_unwritable = Gauge(
    "completions_usage_journal_unwritable",
    "1 while the usage journal cannot be written (new generation requests get a 503), else 0.",
    multiprocess_mode="livemax",
)
journal_errors = Counter(
    "completions_usage_journal_errors",
    "Failed writes to the usage journal (a full disk, a read-only folder).",
)
usage_record_failures = Counter(
    "completions_usage_record_write_failures",
    "Usage records the database did not take when first written; each waits in the journal and is "
    "written when the database answers again.",
)
usage_records_set_aside = Counter(
    "completions_usage_records_set_aside",
    "Usage records the database refused for themselves (not an outage): kept in the journal's "
    "set_aside table, and logged, for the operators.",
)
usage_records_lost = Counter(
    "completions_usage_records_lost",
    "Usage records that neither the journal nor the database took (logged with their fields).",
)
