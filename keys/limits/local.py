"""Counters in this process's memory: for a single-process deployment, or while Redis is down.

The same rules as ``acquire.lua`` and ``settle.lua``; ``tests`` run one specification against both
stores.  Times are ``time.monotonic()`` milliseconds.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings

from . import decision
from .decision import (
    BUDGET,
    CONCURRENCY,
    QUOTA,
    REQUESTS,
    TOKENS,
    TOO_LARGE,
    Decision,
    Scope,
    TotalsUnknown,
    Usage,
)


@dataclass
class _Counters:
    """One scope's per-minute and in-flight counters."""

    requests: collections.deque[int] = field(default_factory=collections.deque)  # admission times, ms
    tokens: dict[str, list[int]] = field(default_factory=dict)  # request_id -> [ms, tokens], oldest first
    token_sum: int = 0
    in_flight: dict[str, int] = field(default_factory=dict)  # request_id -> lease end, ms

    def expire(self, now: int) -> None:
        cutoff = now - decision.WINDOW_MS
        while self.requests and self.requests[0] <= cutoff:
            self.requests.popleft()
        while self.tokens:  # oldest first: stop at the first still in the window
            oldest = next(iter(self.tokens))
            if self.tokens[oldest][0] > cutoff:
                break
            self.token_sum -= self.tokens.pop(oldest)[1]
        for ended in [rid for rid, end in self.in_flight.items() if end <= now]:
            del self.in_flight[ended]


class LocalStore:
    """A :class:`~keys.limits.limiter.CounterStore` in this process's memory, behind one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, _Counters] = collections.defaultdict(_Counters)
        # (scope name, "tokens:<month>" or "spend:<budget window>") -> the period's total
        self._totals: dict[tuple[str, str], int] = {}

    @staticmethod
    def _now() -> int:
        return int(time.monotonic() * 1000)

    async def acquire(
        self, scopes: Sequence[Scope], request_id: str, tokens: int, cost: int, dry_run: bool
    ) -> Decision:
        """See :meth:`keys.limits.limiter.CounterStore.acquire`."""
        with self._lock:
            return self._acquire(scopes, request_id, tokens, cost, dry_run)

    def _acquire(self, scopes: Sequence[Scope], request_id: str, tokens: int, cost: int, dry_run: bool) -> Decision:
        now = self._now()
        for scope in scopes:
            self._counters[scope.name].expire(now)
        refusal: str | None = None
        refused_by = retry = 0
        if not dry_run:
            if any(self._total(scope, kind) is None for scope in scopes for kind in ("tokens", "spend")):
                raise TotalsUnknown
            refusal, refused_by, retry = self._refusal(scopes, tokens, cost, now)
            if refusal is None:
                for scope in scopes:
                    self._count(scope, request_id, tokens, cost, now)
        return Decision(refusal, tuple(self._usage(scope, now) for scope in scopes), refused_by, retry)

    def _total(self, scope: Scope, kind: str) -> int | None:
        return self._totals.get(_total_key(scope, kind))

    def _usage(self, scope: Scope, now: int) -> Usage:
        counters = self._counters[scope.name]
        newest_request = counters.requests[-1] if counters.requests else None
        newest_tokens = next(reversed(counters.tokens.values()))[0] if counters.tokens else None
        month_tokens, spend = self._total(scope, "tokens"), self._total(scope, "spend")
        return Usage(
            requests=len(counters.requests),
            tokens=counters.token_sum,
            concurrent=len(counters.in_flight),
            month_tokens=-1 if month_tokens is None else month_tokens,
            spend=-1 if spend is None else spend,
            reset_requests_ms=0 if newest_request is None else newest_request + decision.WINDOW_MS - now,
            reset_tokens_ms=0
            if newest_tokens is None or not counters.token_sum
            else newest_tokens + decision.WINDOW_MS - now,
        )

    def _count(self, scope: Scope, request_id: str, tokens: int, cost: int, now: int) -> None:
        counters, limits = self._counters[scope.name], scope.limits
        if limits.rpm:
            counters.requests.append(now)
        if limits.tpm:
            counters.tokens[request_id] = [now, tokens]
            counters.token_sum += tokens
        if limits.max_concurrent:
            counters.in_flight[request_id] = now + _lease_ms()
        self._totals[_total_key(scope, "tokens")] += tokens
        self._totals[_total_key(scope, "spend")] += cost

    def _refusal(self, scopes: Sequence[Scope], tokens: int, cost: int, now: int) -> tuple[str | None, int, int]:
        """The first refusal (in :data:`~keys.limits.decision.REFUSALS`' order, each over every
        scope), the index of the scope that refuses, and the wait until it would admit."""
        checks = (self._quota, self._budget, self._too_large, self._concurrency, self._requests, self._tokens)
        for check in checks:
            for index, scope in enumerate(scopes):
                refusal, retry = check(scope, tokens, cost, now)
                if refusal is not None:
                    return refusal, index, retry
        return None, 0, 0

    def _quota(self, scope: Scope, tokens: int, cost: int, now: int) -> tuple[str | None, int]:
        monthly = scope.limits.monthly_tokens
        return (QUOTA, 0) if monthly and self._total(scope, "tokens") + tokens > monthly else (None, 0)  # type: ignore[operator]

    def _budget(self, scope: Scope, tokens: int, cost: int, now: int) -> tuple[str | None, int]:
        budget = scope.limits.budget
        return (BUDGET, 0) if budget and self._total(scope, "spend") + cost > budget else (None, 0)  # type: ignore[operator]

    def _too_large(self, scope: Scope, tokens: int, cost: int, now: int) -> tuple[str | None, int]:
        tpm = scope.limits.tpm
        return (TOO_LARGE, 0) if tpm and tokens > tpm else (None, 0)

    def _concurrency(self, scope: Scope, tokens: int, cost: int, now: int) -> tuple[str | None, int]:
        most = scope.limits.max_concurrent
        return (CONCURRENCY, 1000) if most and len(self._counters[scope.name].in_flight) >= most else (None, 0)

    def _requests(self, scope: Scope, tokens: int, cost: int, now: int) -> tuple[str | None, int]:
        rpm, requests = scope.limits.rpm, self._counters[scope.name].requests
        if not rpm or len(requests) < rpm:
            return None, 0
        freeing = requests[len(requests) - rpm]
        return REQUESTS, max(1, freeing + decision.WINDOW_MS - now)

    def _tokens(self, scope: Scope, tokens: int, cost: int, now: int) -> tuple[str | None, int]:
        tpm, counters = scope.limits.tpm, self._counters[scope.name]
        if not tpm or counters.token_sum + tokens <= tpm:
            return None, 0
        needed = counters.token_sum + tokens - tpm
        for ms, amount in counters.tokens.values():
            needed -= amount
            if needed <= 0:
                return TOKENS, max(1, ms + decision.WINDOW_MS - now)
        return TOKENS, decision.WINDOW_MS

    async def seed(self, scope: Scope, month_tokens: int, spend: int) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.seed`."""
        with self._lock:
            self._totals.setdefault(_total_key(scope, "tokens"), month_tokens)
            self._totals.setdefault(_total_key(scope, "spend"), spend)

    async def renew(self, scopes: Sequence[Scope], request_id: str) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.renew`."""
        with self._lock:
            for scope in scopes:
                if scope.limits.max_concurrent:
                    self._counters[scope.name].in_flight[request_id] = self._now() + _lease_ms()

    async def settle(
        self, scopes: Sequence[Scope], request_id: str, reserved: int, used: int, reserved_cost: int, cost: int
    ) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.settle`."""
        with self._lock:
            for scope in scopes:
                counters = self._counters[scope.name]
                counters.in_flight.pop(request_id, None)
                held = counters.tokens.get(request_id)
                if held is not None:
                    counters.token_sum += used - held[1]
                    held[1] = used
                for kind, change in (("tokens", used - reserved), ("spend", cost - reserved_cost)):
                    if _total_key(scope, kind) in self._totals:
                        self._totals[_total_key(scope, kind)] += change


def _total_key(scope: Scope, kind: str) -> tuple[str, str]:
    """The key of a scope's month tokens (``kind`` ``"tokens"``) or budget spend (``"spend"``)."""
    return scope.name, f"tokens:{scope.month}" if kind == "tokens" else f"spend:{scope.budget_window}"


def _lease_ms() -> int:
    return int(settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS * 1000)
