"""Counters in this process's memory: for a single-process deployment, or while Redis is down.

The same rules as ``acquire.lua`` and ``settle.lua``; ``tests`` run one specification against both
stores.  Times are ``time.monotonic()`` milliseconds.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings

from . import decision
from .decision import CONCURRENCY, QUOTA, REQUESTS, TOKENS, TOO_LARGE, Decision, Limits, MonthUnknown


@dataclass
class _KeyCounters:
    requests: collections.deque[int] = field(default_factory=collections.deque)  # admission times, ms
    tokens: dict[str, list[int]] = field(default_factory=dict)  # request_id -> [ms, tokens], oldest first
    token_sum: int = 0
    in_flight: dict[str, int] = field(default_factory=dict)  # request_id -> lease end, ms


class LocalStore:
    """A :class:`~keys.limits.limiter.CounterStore` in this process's memory, behind one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[int, _KeyCounters] = collections.defaultdict(_KeyCounters)
        self._months: dict[tuple[int, str], int] = {}

    @staticmethod
    def _now() -> int:
        return int(time.monotonic() * 1000)

    async def acquire(
        self, key_id: int, request_id: str, limits: Limits, tokens: int, month: str, dry_run: bool
    ) -> Decision:
        """See :meth:`keys.limits.limiter.CounterStore.acquire`."""
        with self._lock:
            return self._acquire(key_id, request_id, limits, tokens, month, dry_run)

    def _acquire(
        self, key_id: int, request_id: str, limits: Limits, tokens: int, month: str, dry_run: bool
    ) -> Decision:
        now = self._now()
        cutoff = now - decision.WINDOW_MS
        counters = self._keys[key_id]
        while counters.requests and counters.requests[0] <= cutoff:
            counters.requests.popleft()
        while counters.tokens:  # oldest first: stop at the first still in the window
            oldest = next(iter(counters.tokens))
            if counters.tokens[oldest][0] > cutoff:
                break
            counters.token_sum -= counters.tokens.pop(oldest)[1]
        for ended in [rid for rid, end in counters.in_flight.items() if end <= now]:
            del counters.in_flight[ended]
        month_tokens = self._months.get((key_id, month))
        refusal: str | None = None
        retry = 0
        if not dry_run:
            if month_tokens is None:
                raise MonthUnknown
            refusal, retry = self._refusal(counters, limits, tokens, month_tokens, now)
            if refusal is None:
                self._count(counters, limits, request_id, tokens, now)
                month_tokens += tokens
                self._months[(key_id, month)] = month_tokens
        newest_request = counters.requests[-1] if counters.requests else None
        newest_tokens = next(reversed(counters.tokens.values()))[0] if counters.tokens else None
        return Decision(
            refusal=refusal,
            requests=len(counters.requests),
            tokens=counters.token_sum,
            concurrent=len(counters.in_flight),
            month_tokens=-1 if month_tokens is None else month_tokens,
            reset_requests_ms=0 if newest_request is None else newest_request + decision.WINDOW_MS - now,
            reset_tokens_ms=0
            if newest_tokens is None or not counters.token_sum
            else newest_tokens + decision.WINDOW_MS - now,
            retry_after_ms=retry,
        )

    @staticmethod
    def _count(counters: _KeyCounters, limits: Limits, request_id: str, tokens: int, now: int) -> None:
        if limits.rpm:
            counters.requests.append(now)
        if limits.tpm:
            counters.tokens[request_id] = [now, tokens]
            counters.token_sum += tokens
        if limits.max_concurrent:
            counters.in_flight[request_id] = now + _lease_ms()

    @staticmethod
    def _refusal(
        counters: _KeyCounters, limits: Limits, tokens: int, month_tokens: int, now: int
    ) -> tuple[str | None, int]:
        if limits.monthly_tokens and month_tokens + tokens > limits.monthly_tokens:
            return QUOTA, 0
        if limits.tpm and tokens > limits.tpm:
            return TOO_LARGE, 0
        if limits.max_concurrent and len(counters.in_flight) >= limits.max_concurrent:
            return CONCURRENCY, 1000
        if limits.rpm and len(counters.requests) >= limits.rpm:
            freeing = counters.requests[len(counters.requests) - limits.rpm]
            return REQUESTS, max(1, freeing + decision.WINDOW_MS - now)
        if limits.tpm and counters.token_sum + tokens > limits.tpm:
            needed = counters.token_sum + tokens - limits.tpm
            for ms, amount in counters.tokens.values():
                needed -= amount
                if needed <= 0:
                    return TOKENS, max(1, ms + decision.WINDOW_MS - now)
            return TOKENS, decision.WINDOW_MS
        return None, 0

    async def seed_month(self, key_id: int, month: str, tokens: int) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.seed_month`."""
        with self._lock:
            self._months.setdefault((key_id, month), tokens)

    async def renew(self, key_id: int, request_id: str) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.renew`."""
        with self._lock:
            self._keys[key_id].in_flight[request_id] = self._now() + _lease_ms()

    async def settle(self, key_id: int, request_id: str, month: str, reserved: int, used: int) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.settle`."""
        with self._lock:
            counters = self._keys[key_id]
            counters.in_flight.pop(request_id, None)
            held = counters.tokens.get(request_id)
            if held is not None:
                counters.token_sum += used - held[1]
                held[1] = used
            if (key_id, month) in self._months:
                self._months[(key_id, month)] += used - reserved


def _lease_ms() -> int:
    return int(settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS * 1000)
