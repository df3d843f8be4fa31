"""Per-key limits: requests and tokens per minute, concurrent requests, tokens per calendar month.

The API calls :func:`admit` once a request is validated and its prompt tokenised, before the
engine sees it.  ``admit`` checks every limit and, if all allow the request, counts it and
*reserves* its largest possible cost (prompt tokens plus ``max_tokens`` times the number of
choices) in one atomic step; :meth:`Admission.settle` later replaces the reservation with the
tokens really used and frees the concurrency slot.  So concurrent requests can never overshoot a
token limit or a quota by what they have not generated yet (LiteLLM counts tokens only after the
response, and concurrent requests overshoot).

Windows are sliding: at most ``rpm`` requests, and at most ``tpm`` tokens, in any 60 seconds.
Tokens count at the moment of their request's admission.  A refused request counts for nothing,
so the wait it is told is the exact wait before the same request would be admitted.  The monthly
quota counts the key's month-to-date tokens (:func:`keys.usage.month_tokens`) plus the
reservations in flight; its counter starts from the database the first time it is needed, so a
restart or a lost Redis does not forget what was used.

Where the counters live: with ``REDIS_URL`` set, in Redis (:mod:`keys.limits.redis`), shared by
every process and machine.  Without it, in this process (:mod:`keys.limits.local`).  When Redis
cannot be reached, ``API_LIMITS_FAIL_MODE`` decides: ``open`` (the default) serves on, each
process enforcing the limits alone with its own counters (so N processes let through up to N
times a per-minute limit until Redis is back), and logs an error; ``closed`` refuses
(:class:`~keys.errors.LimiterUnavailable`).  Redis is retried after
``API_LIMITS_REDIS_RETRY_SECONDS``.

Refusals are the domain's errors (:mod:`keys.errors`); the API turns them into 429s and 503s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from keys import metrics, periods
from keys.db import DATABASE_DOWN, db_call
from keys.errors import DatabaseUnavailable, LimiterUnavailable, LimitRefused
from keys.models import APIKey
from keys.usage import month_tokens

from .decision import Decision, Limits, MonthUnknown, StoreUnavailable
from .local import LocalStore
from .redis import RedisStore

logger = logging.getLogger(__name__)


class CounterStore(Protocol):
    """Where counters live; :class:`LocalStore` and :class:`RedisStore` implement the same rules."""

    async def acquire(
        self, key_id: int, request_id: str, limits: Limits, tokens: int, month: str, dry_run: bool
    ) -> Decision:
        """Check every limit and, unless refused (or ``dry_run``), count the request and reserve
        ``tokens``.  Raises :class:`MonthUnknown` when the month's counter is missing (never on a
        dry run) and :class:`StoreUnavailable` when the store does not answer."""
        ...

    async def seed_month(self, key_id: int, month: str, tokens: int) -> None:
        """Start the month's counter at ``tokens`` unless another process started it first."""
        ...

    async def settle(self, key_id: int, request_id: str, month: str, reserved: int, used: int) -> None:
        """Replace the reservation of ``reserved`` tokens with ``used`` and free the concurrency slot."""
        ...

    async def renew(self, key_id: int, request_id: str) -> None:
        """Extend the lease of a running request's concurrency slot to ``API_LIMITS_CONCURRENCY_LEASE_SECONDS``
        from now (taking the slot again if it was lost)."""
        ...


@dataclass
class Admission:
    """An admitted request's reservation; :meth:`settle` it exactly once, when the request ends.

    ``limits`` and ``decision`` are what the headers of its response report.  While the request
    runs, its concurrency slot's lease is renewed every third of
    ``API_LIMITS_CONCURRENCY_LEASE_SECONDS`` (:meth:`keep_slot`), so that the slot of a process
    killed without settling frees itself within one lease.
    """

    store: CounterStore
    key_id: int
    request_id: str
    month: str
    reserved: int
    limits: Limits
    decision: Decision
    settled: bool = field(default=False, init=False)
    renewal: asyncio.Task | None = field(default=None, init=False, repr=False)

    def keep_slot(self) -> None:
        """Start renewing the concurrency slot's lease until :meth:`settle` (a key with a concurrency limit)."""
        interval = settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS / 3
        self.renewal = asyncio.ensure_future(_renew_lease(weakref.ref(self), interval))

    async def settle(self, used_tokens: int) -> None:
        """Replace the reservation with ``used_tokens`` and free the concurrency slot; never raises."""
        if self.settled:
            return
        self.settled = True
        if self.renewal is not None:
            # Stopped before the slot is freed: a renewal sent after the settlement would take it again.
            self.renewal.cancel()
            if self.renewal.get_loop() is asyncio.get_running_loop():  # tests may settle on another loop
                await asyncio.gather(self.renewal, return_exceptions=True)
        try:
            await self.store.settle(self.key_id, self.request_id, self.month, self.reserved, used_tokens)
        except Exception:
            logger.exception("Could not settle the reservation of %s", self.request_id)


async def _renew_lease(ref: weakref.ref[Admission], interval: float) -> None:
    """Renew the referenced admission's slot every ``interval`` seconds until it is settled or dropped."""
    while True:
        await asyncio.sleep(interval)
        admission = ref()
        if admission is None or admission.settled:
            return
        try:
            await admission.store.renew(admission.key_id, admission.request_id)
        except Exception as error:  # noqa: BLE001 - the next renewal tries again; the lease is three of them
            logger.warning("Could not renew the concurrency slot of %s: %s", admission.request_id, error)
        del admission  # only the reference at the top of the loop: a dropped request is not kept alive


async def admit(api_key: APIKey, request_id: str, tokens: int) -> Admission:
    """Count and reserve one request of up to ``tokens`` tokens, or refuse it.

    Raises :class:`~keys.errors.LimitRefused` when a limit or the quota refuses it,
    :class:`~keys.errors.LimiterUnavailable` when Redis is down and ``API_LIMITS_FAIL_MODE`` is
    ``closed``, and :class:`~keys.errors.DatabaseUnavailable` when the month's quota counter must be
    read from a database that does not answer.  A client that disconnects while the store answers
    leaves nothing reserved.
    """
    task = asyncio.ensure_future(_admit(api_key, request_id, tokens))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            admission = await task
        except Exception:  # noqa: BLE001 - refused or failed: nothing is held
            raise asyncio.CancelledError from None
        await admission.settle(0)
        raise


async def peek(api_key: APIKey) -> tuple[Limits, Decision] | None:
    """The key's limits and current counts without counting anything; ``None`` without per-minute
    limits, or when the counters cannot be read (the limiter logged why)."""
    limits = Limits.of(api_key)
    if not (limits.rpm or limits.tpm):
        return None
    try:
        _, decision = await limiter().acquire(api_key.pk, "", limits, 0, current_month(), True)
    except Exception:  # noqa: BLE001 - a courtesy for the headers; never a reason to fail a response
        return None
    return limits, decision


async def _admit(api_key: APIKey, request_id: str, tokens: int) -> Admission:
    limits = Limits.of(api_key)
    month = current_month()
    proc = limiter()
    for _ in range(3):
        try:
            store, decision = await proc.acquire(api_key.pk, request_id, limits, tokens, month, False)
        except MonthUnknown:
            try:
                used = await db_call(month_tokens_in_database, api_key.pk, month)
            except DATABASE_DOWN as error:
                raise DatabaseUnavailable(error) from error
            await proc.seed_month(api_key.pk, month, used)
            continue
        if proc.serving_locally(store):
            metrics.limiter_fail_open_requests.inc()  # once per request, whatever it took to admit it
        if decision.refusal is not None:
            metrics.refused(decision.refusal)
            raise LimitRefused(decision, limits, tokens, month)
        admission = Admission(store, api_key.pk, request_id, month, tokens, limits, decision)
        if limits.max_concurrent:
            admission.keep_slot()
        return admission
    raise LimiterUnavailable(closed=False, retry_after_seconds=1)


def month_tokens_in_database(key_id: int, month: str) -> int:
    """The key's month-to-date tokens in ``month`` (``"YYYY-MM"``, UTC), from the database."""
    return month_tokens(month, api_key_ids=[key_id]).get(key_id, 0)


def current_month() -> str:
    """This month's name, ``"YYYY-MM"`` in UTC: the key of its quota counter."""
    return periods.month_name()


class Limiter:
    """This process's way to the counters: Redis when configured and reachable, else its own.

    After a Redis failure it logs one error and leaves Redis alone for
    ``API_LIMITS_REDIS_RETRY_SECONDS``, serving from :class:`LocalStore` (fail open) or raising
    :class:`~keys.errors.LimiterUnavailable` (fail closed) in the meantime.
    """

    def __init__(self) -> None:
        self.local = LocalStore()
        self.redis = (
            RedisStore(settings.REDIS_URL, settings.API_LIMITS_REDIS_PREFIX, settings.API_LIMITS_REDIS_TIMEOUT)
            if settings.REDIS_URL
            else None
        )
        self.fail_open = settings.API_LIMITS_FAIL_MODE == "open"
        self._redis_down_until = 0.0

    def _store(self) -> CounterStore:
        """The store in charge now; raises ``LimiterUnavailable`` while Redis is down and failing closed."""
        if self.redis is not None and time.monotonic() >= self._redis_down_until:
            return self.redis
        if self.redis is not None and not self.fail_open:
            raise LimiterUnavailable(
                closed=True, retry_after_seconds=math.ceil(settings.API_LIMITS_REDIS_RETRY_SECONDS)
            )
        return self.local

    def serving_locally(self, store: CounterStore) -> bool:
        """Whether ``store`` is this process's own in place of a Redis that is down (fail open)."""
        return self.redis is not None and store is self.local

    def _redis_failed(self, error: StoreUnavailable) -> None:
        assert self.redis is not None
        metrics.limiter_store_errors.inc()
        now = time.monotonic()
        if now < self._redis_down_until:
            return  # a request that was already waiting on Redis when the outage began: same period
        if self.fail_open:
            metrics.limiter_fail_open_periods.inc()
        self._redis_down_until = now + settings.API_LIMITS_REDIS_RETRY_SECONDS
        logger.error(
            "Redis at %s is unavailable (%s): %s for the next %s s",
            _redacted(self.redis.url),
            error,
            "each process enforces the limits alone (fail open)"
            if self.fail_open
            else "requests are refused with 503 (fail closed)",
            settings.API_LIMITS_REDIS_RETRY_SECONDS,
        )

    async def acquire(
        self, key_id: int, request_id: str, limits: Limits, tokens: int, month: str, dry_run: bool
    ) -> tuple[CounterStore, Decision]:
        """:meth:`CounterStore.acquire` on the store in charge; returns that store and its decision."""
        store = self._store()
        try:
            return store, await store.acquire(key_id, request_id, limits, tokens, month, dry_run)
        except StoreUnavailable as error:
            self._redis_failed(error)
        store = self._store()
        return store, await store.acquire(key_id, request_id, limits, tokens, month, dry_run)

    async def seed_month(self, key_id: int, month: str, tokens: int) -> None:
        """:meth:`CounterStore.seed_month` on the store in charge."""
        store = self._store()
        try:
            await store.seed_month(key_id, month, tokens)
            return
        except StoreUnavailable as error:
            self._redis_failed(error)
        await self._store().seed_month(key_id, month, tokens)

    async def settle(self, key_id: int, request_id: str, month: str, reserved: int, used: int) -> None:
        """:meth:`CounterStore.settle` on the store in charge (tests; requests settle their :class:`Admission`)."""
        store = self._store()
        try:
            await store.settle(key_id, request_id, month, reserved, used)
            return
        except StoreUnavailable as error:
            self._redis_failed(error)
        await self._store().settle(key_id, request_id, month, reserved, used)


def _redacted(url: str) -> str:
    """``url`` without its password, for the log."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return scheme + sep + rest


_SETTINGS = {
    "REDIS_URL",
    "API_LIMITS_REDIS_PREFIX",
    "API_LIMITS_REDIS_TIMEOUT",
    "API_LIMITS_FAIL_MODE",
    "API_LIMITS_REDIS_RETRY_SECONDS",
}


@functools.cache
def limiter() -> Limiter:
    """The process's :class:`Limiter`, built from the settings on first use (from the event loop,
    the only thread that calls it)."""
    return Limiter()


@receiver(setting_changed)
def _forget_limiter(*, setting: str, **kwargs: Any) -> None:
    """A changed limiter setting (tests) gets a fresh limiter, with fresh local counters."""
    if setting in _SETTINGS:
        limiter.cache_clear()
