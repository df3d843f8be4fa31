"""Per-key, per-user and per-key-and-model limits, quotas and budgets: ``decision`` (values),
``local`` and ``redis`` (counter stores), ``limiter`` (admission and settlement; see its docstring
for the rules)."""

from __future__ import annotations

from .decision import (
    BUDGET,
    CONCURRENCY,
    KEY,
    MODEL,
    QUOTA,
    REQUESTS,
    TOKENS,
    TOO_LARGE,
    USER,
    Decision,
    Limits,
    Scope,
    StoreUnavailable,
    TotalsUnknown,
    Usage,
)
from .limiter import (
    Admission,
    CounterStore,
    Limiter,
    admit,
    current_month,
    limiter,
    month_tokens_in_database,
    peek,
    scopes_of,
    totals_in_database,
)
from .local import LocalStore
from .redis import RedisStore

__all__ = [
    "BUDGET",
    "CONCURRENCY",
    "KEY",
    "MODEL",
    "QUOTA",
    "REQUESTS",
    "TOKENS",
    "TOO_LARGE",
    "USER",
    "Admission",
    "CounterStore",
    "Decision",
    "Limiter",
    "Limits",
    "LocalStore",
    "RedisStore",
    "Scope",
    "StoreUnavailable",
    "TotalsUnknown",
    "Usage",
    "admit",
    "current_month",
    "limiter",
    "month_tokens_in_database",
    "peek",
    "scopes_of",
    "totals_in_database",
]
