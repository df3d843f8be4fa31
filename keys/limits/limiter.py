"""Per-key and per-user limits: requests and tokens per minute, concurrent requests, tokens per
calendar month, and a money budget per period.

Every request counts in two scopes (:class:`~keys.limits.decision.Scope`): its key's and its
user's, the user's counters being shared by all of the user's keys; and in a third, its key's for
its model, where the key has requests and tokens per minute of its own for that model
(``APIKey.model_limits``).  Each scope has its own limits (the key's, :meth:`Limits.of`; the user's,
:meth:`Limits.of_user`; the key's for the model, :meth:`Limits.of_model`); all are checked, and the
request counted in all, in the one atomic step described below, so no scope can overshoot.

The API calls :func:`admit` once a request is validated and its prompt tokenised, before the
engine sees it.  ``admit`` checks every limit and, if all allow the request, counts it and
*reserves* its largest possible cost (prompt tokens plus ``max_tokens`` times the number of
choices, and those tokens' price, :mod:`keys.pricing`) in one atomic step; :meth:`Admission.settle`
later replaces the reservation with the tokens and cost really used and frees the concurrency slot.  So concurrent requests can never overshoot a
token limit or a quota by what they have not generated yet (LiteLLM counts tokens only after the
response, and concurrent requests overshoot).

Windows are sliding: at most ``rpm`` requests, and at most ``tpm`` tokens, in any 60 seconds.
Tokens count at the moment of their request's admission.  A refused request counts for nothing,
so the wait it is told is the exact wait before the same request would be admitted.  The monthly
quota counts the scope's month-to-date tokens (:func:`keys.usage.month_tokens`) plus the
reservations in flight, and the budget its period's cost (:func:`keys.usage.spend_nanos`) likewise;
their counters start from the database the first time they are needed, so a restart or a lost
Redis does not forget what was used.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from keys import metrics, periods
from keys.db import DATABASE_DOWN, db_call
from keys.errors import DatabaseUnavailable, LimiterUnavailable, LimitRefused
from keys.models import APIKey, UserLimits
from keys.redaction import redact
from keys.usage import month_tokens, spend_nanos

from .decision import KEY, MODEL, USER, Decision, Limits, Scope, StoreUnavailable, TotalsUnknown
from .local import LocalStore
from .redis import RedisStore

logger = logging.getLogger(__name__)


class CounterStore(Protocol):
    """Where counters live; :class:`LocalStore` and :class:`RedisStore` implement the same rules."""

    async def acquire(
        self, scopes: Sequence[Scope], request_id: str, tokens: int, cost: int, dry_run: bool
    ) -> Decision:
        """Check every limit of every scope and, unless one refuses (or ``dry_run``), count the
        request and reserve ``tokens`` and ``cost`` (nanos) in each.  Raises :class:`TotalsUnknown`
        when a month or budget counter is missing (never on a dry run) and
        :class:`StoreUnavailable` when the store does not answer."""
        ...

    async def seed(self, scope: Scope, month_tokens: int, spend: int) -> None:
        """Start the scope's month and budget counters at these totals unless another process did first."""
        ...

    async def settle(
        self, scopes: Sequence[Scope], request_id: str, reserved: int, used: int, reserved_cost: int, cost: int
    ) -> None:
        """Replace the reservations of ``reserved`` tokens and ``reserved_cost`` nanos with ``used``
        and ``cost`` and free the concurrency slots."""
        ...

    async def renew(self, scopes: Sequence[Scope], request_id: str) -> None:
        """Extend the leases of a running request's concurrency slots (in the scopes with a
        concurrency limit) to ``API_LIMITS_CONCURRENCY_LEASE_SECONDS`` from now, taking a slot again
        if it was lost."""
        ...


@dataclass
class Admission:
    """An admitted request's reservation; :meth:`settle` it exactly once, when the request ends.

    ``scopes`` and ``decision`` are what the headers of its response report (``limits`` is the
    key's).  While the request runs, its concurrency slots' leases are renewed every third of
    ``API_LIMITS_CONCURRENCY_LEASE_SECONDS`` (:meth:`keep_slot`), so that the slot of a process
    killed without settling frees itself within one lease.
    """

    store: CounterStore
    scopes: tuple[Scope, ...]
    request_id: str
    reserved: int
    reserved_cost: int
    decision: Decision
    settled: bool = field(default=False, init=False)
    renewal: asyncio.Task | None = field(default=None, init=False, repr=False)

    @property
    def limits(self) -> Limits:
        """The key's limits."""
        return self.scopes[0].limits

    def keep_slot(self) -> None:
        """Start renewing the concurrency slots' leases until :meth:`settle` (a scope with a concurrency limit)."""
        interval = settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS / 3
        self.renewal = asyncio.ensure_future(_renew_lease(weakref.ref(self), interval))

    async def settle(self, used_tokens: int, cost: int = 0) -> None:
        """Replace the reservation with ``used_tokens`` and ``cost`` (nanos) and free the slots; never raises."""
        if self.settled:
            return
        self.settled = True
        if self.renewal is not None:
            # Stopped before the slot is freed: a renewal sent after the settlement would take it again.
            self.renewal.cancel()
            if self.renewal.get_loop() is asyncio.get_running_loop():  # tests may settle on another loop
                await asyncio.gather(self.renewal, return_exceptions=True)
        try:
            await self.store.settle(self.scopes, self.request_id, self.reserved, used_tokens, self.reserved_cost, cost)
        except Exception:
            logger.exception("Could not settle the reservation of %s", self.request_id)


async def _renew_lease(ref: weakref.ref[Admission], interval: float) -> None:
    """Renew the referenced admission's slots every ``interval`` seconds until it is settled or dropped."""
    while True:
        await asyncio.sleep(interval)
        admission = ref()
        if admission is None or admission.settled:
            return
        try:
            await admission.store.renew(admission.scopes, admission.request_id)
        except Exception as error:  # noqa: BLE001 - the next renewal tries again; the lease is three of them
            logger.warning("Could not renew the concurrency slot of %s: %s", admission.request_id, error)
        del admission  # only the reference at the top of the loop: a dropped request is not kept alive


async def admit(api_key: APIKey, request_id: str, tokens: int, cost: int = 0, model: str = "") -> Admission:
    """Count and reserve one request for ``model`` (the served model's id) of up to ``tokens``
    tokens costing up to ``cost`` nanos, or refuse it.

    Raises :class:`~keys.errors.LimitRefused` when a limit, quota or budget of the key, of its user
    or of the key for the model refuses it, :class:`~keys.errors.LimiterUnavailable` when Redis is down and
    ``API_LIMITS_FAIL_MODE`` is ``closed``, and :class:`~keys.errors.DatabaseUnavailable` when a
    counter must be read from a database that does not answer.  A client that disconnects while
    the store answers leaves nothing reserved.
    """
    task = asyncio.ensure_future(_admit(api_key, request_id, tokens, cost, model))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            admission = await task
        except Exception:  # noqa: BLE001 - refused or failed: nothing is held
            raise asyncio.CancelledError from None
        await admission.settle(0)
        raise


async def peek(api_key: APIKey, model: str = "") -> tuple[tuple[Scope, ...], Decision] | None:
    """The key's, its user's (and the key's for ``model``) scopes and current counts without
    counting anything; ``None`` without per-minute limits, or when the counters cannot be read (the
    limiter logged why)."""
    try:
        scopes = await scopes_of(api_key, model=model)
    except Exception:  # noqa: BLE001 - a courtesy for the headers; never a reason to fail a response
        return None
    if not any(scope.limits.rpm or scope.limits.tpm for scope in scopes):
        return None
    try:
        _, decision = await limiter().acquire(scopes, "", 0, 0, True)
    except Exception:  # noqa: BLE001 - as above
        return None
    return scopes, decision


async def scopes_of(api_key: APIKey, moment: datetime | None = None, model: str = "") -> tuple[Scope, ...]:
    """The key's scope and its owner's, with their limits in force and their current periods, then
    the key's for ``model`` where it has limits of its own for that model."""
    own = await _user_limits_row(api_key)
    key_limits, user_limits = Limits.of(api_key), Limits.of_user(own)
    month = periods.month_name(moment)
    owner = api_key.owner_id
    scopes = (
        Scope(KEY, api_key.pk, owner, key_limits, month, periods.budget_period_name(key_limits.budget_period, moment)),
        Scope(USER, owner, owner, user_limits, month, periods.budget_period_name(user_limits.budget_period, moment)),
    )
    model_limits = Limits.of_model(api_key, model)
    if model_limits is None:
        return scopes
    # Per-minute limits only: the month's and the budget's counters are kept but never refuse.
    return (*scopes, Scope(MODEL, api_key.pk, owner, model_limits, month, scopes[0].budget_window, model))


async def _user_limits_row(api_key: APIKey) -> UserLimits | None:
    """The owner's :class:`UserLimits` row: loaded with the key by authentication, else read now."""
    owner = api_key._state.fields_cache.get("owner")
    if owner is not None and "limits" in owner._state.fields_cache:
        return owner._state.fields_cache["limits"]
    try:
        return await db_call(UserLimits.objects.filter(user_id=api_key.owner_id).first)
    except DATABASE_DOWN as error:
        raise DatabaseUnavailable(error) from error


async def _admit(api_key: APIKey, request_id: str, tokens: int, cost: int, model: str) -> Admission:
    scopes = await scopes_of(api_key, model=model)
    proc = limiter()
    for _ in range(3):
        try:
            store, decision = await proc.acquire(scopes, request_id, tokens, cost, False)
        except TotalsUnknown:
            for scope in scopes:
                try:
                    month_tokens, spend = await db_call(totals_in_database, scope)
                except DATABASE_DOWN as error:
                    raise DatabaseUnavailable(error) from error
                await proc.seed(scope, month_tokens, spend)
            continue
        if proc.serving_locally(store):
            metrics.limiter_fail_open_requests.inc()  # once per request, whatever it took to admit it
        if decision.refusal is not None:
            metrics.refused(decision.refusal)
            raise LimitRefused(decision, scopes, tokens, cost)
        admission = Admission(store, scopes, request_id, tokens, cost, decision)
        if any(scope.limits.max_concurrent for scope in scopes):
            admission.keep_slot()
        return admission
    raise LimiterUnavailable(closed=False, retry_after_seconds=1)


def totals_in_database(scope: Scope) -> tuple[int, int]:
    """The scope's tokens in its month and cost (nanos) in its budget window, from the usage records
    (0 and 0 for a key's scope for one model, which has no monthly quota nor budget to check)."""
    if scope.kind == MODEL:
        return 0, 0
    if scope.kind == KEY:
        return month_tokens_in_database(scope.id, scope.month), spend_nanos(scope.budget_window, api_key_id=scope.id)
    month = month_tokens(scope.month, owner_ids=[scope.id]).get(scope.id, 0)
    return month, spend_nanos(scope.budget_window, owner_id=scope.id)


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

    async def _call(self, method: str, *args: Any) -> tuple[CounterStore, Any]:
        """``method`` of the store in charge; after a Redis failure, of the store in charge then."""
        store = self._store()
        try:
            return store, await getattr(store, method)(*args)
        except StoreUnavailable as error:
            self._redis_failed(error)
        store = self._store()
        return store, await getattr(store, method)(*args)

    async def acquire(
        self, scopes: Sequence[Scope], request_id: str, tokens: int, cost: int, dry_run: bool
    ) -> tuple[CounterStore, Decision]:
        """:meth:`CounterStore.acquire` on the store in charge; returns that store and its decision."""
        return await self._call("acquire", scopes, request_id, tokens, cost, dry_run)

    async def seed(self, scope: Scope, month_tokens: int, spend: int) -> None:
        """:meth:`CounterStore.seed` on the store in charge."""
        await self._call("seed", scope, month_tokens, spend)

    async def settle(
        self, scopes: Sequence[Scope], request_id: str, reserved: int, used: int, reserved_cost: int = 0, cost: int = 0
    ) -> None:
        """:meth:`CounterStore.settle` on the store in charge (tests; requests settle their :class:`Admission`)."""
        await self._call("settle", scopes, request_id, reserved, used, reserved_cost, cost)


def _redacted(url: str) -> str:
    """``url`` without its password (``user:password@`` or a ``password=`` query parameter), for the log."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return redact(scheme + sep + rest)


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
