"""Per-key limits and quotas: ``decision`` (values), ``local`` and ``redis`` (counter stores),
``limiter`` (admission and settlement; see its docstring for the rules)."""

from __future__ import annotations

from .decision import (
    CONCURRENCY,
    QUOTA,
    REQUESTS,
    TOKENS,
    TOO_LARGE,
    Decision,
    Limits,
    MonthUnknown,
    StoreUnavailable,
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
)
from .local import LocalStore
from .redis import RedisStore

__all__ = [
    "CONCURRENCY",
    "QUOTA",
    "REQUESTS",
    "TOKENS",
    "TOO_LARGE",
    "Admission",
    "CounterStore",
    "Decision",
    "Limiter",
    "Limits",
    "LocalStore",
    "MonthUnknown",
    "RedisStore",
    "StoreUnavailable",
    "admit",
    "current_month",
    "limiter",
    "month_tokens_in_database",
    "peek",
]
