"""Counters in Redis, shared by every process and machine: one Lua script per check.

``acquire.lua``, ``settle.lua`` and ``renew.lua`` beside this module are the rules (the same as ``local.py``'s);
each runs atomically in one round trip, timed by the Redis server's clock, so the machines'
clocks do not matter.  The counters of a user and of each of their keys share the hash tag
``{u<user id>}``, so that one script can check a key's and its user's together on one Redis Cluster
node.  A key's counters for one model (``model_limits``) are under the same tag.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Final

from django.conf import settings

from . import decision
from .decision import REFUSALS, Decision, Scope, StoreUnavailable, TotalsUnknown, Usage

# A month's or a budget window's counter outlives a month, then goes: the next request seeds it
# again from the database (so a budget that never resets is read again every 40 days).
TOTAL_TTL_SECONDS: Final = 40 * 24 * 3600
_ACQUIRE, _SETTLE, _RENEW = 1, 2, 3  # indexes of the registered scripts in a client entry
_ACQUIRE_KEYS = ("requests", "tokens", "token_amounts", "token_sum", "in_flight", "month", "spend")
_SETTLE_KEYS = ("token_amounts", "token_sum", "in_flight", "month", "spend")


@cache
def lua(name: str) -> str:
    """The source of the Lua script ``name`` (``"acquire"``, ``"settle"``, ``"renew"``) beside this module."""
    return Path(__file__).with_name(f"{name}.lua").read_text()


class RedisStore:
    """A :class:`~keys.limits.limiter.CounterStore` in Redis at ``url``, keys under ``prefix``.

    ``timeout`` (seconds) bounds connecting and each reply; a failure raises
    :class:`~keys.limits.decision.StoreUnavailable`.
    """

    def __init__(self, url: str, prefix: str, timeout: float) -> None:
        self.url = url
        self.prefix = prefix
        self.timeout = timeout
        # redis.asyncio connections belong to the event loop that opened them.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, ...]] = (
            weakref.WeakKeyDictionary()
        )

    def key_names(self, scope: Scope) -> dict[str, str]:
        """The Redis keys of ``scope``'s counters (its month's quota and its budget window's spend too)."""
        base = f"{self.prefix}{{u{scope.owner_id}}}:{scope.name}"
        return {
            "requests": f"{base}:requests",
            "tokens": f"{base}:tokens",
            "token_amounts": f"{base}:token-amounts",
            "token_sum": f"{base}:token-sum",
            "in_flight": f"{base}:in-flight",
            "month": f"{base}:month:{scope.month}",
            "spend": f"{base}:spend:{scope.budget_window}",
        }

    def _client(self) -> tuple[Any, ...]:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is None:
            from redis.asyncio import Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            # One quick retry (a pooled connection may have gone stale), no backoff: a Redis that
            # is down must cost a request a fraction of a second, not several.
            client = Redis.from_url(
                self.url,
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 1),
            )
            entry = (client, *(client.register_script(lua(name)) for name in ("acquire", "settle", "renew")))
            self._clients[loop] = entry
        return entry

    async def _run(self, script_index: int, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import RedisError

        try:
            return await self._client()[script_index](keys=keys, args=args)
        except (TimeoutError, RedisError, OSError) as error:
            raise StoreUnavailable(f"{type(error).__name__}: {error}") from error

    async def acquire(
        self, scopes: Sequence[Scope], request_id: str, tokens: int, cost: int, dry_run: bool
    ) -> Decision:
        """See :meth:`keys.limits.limiter.CounterStore.acquire`."""
        keys, limits = [], []
        for scope in scopes:
            names = self.key_names(scope)
            keys += [names[n] for n in _ACQUIRE_KEYS]
            lim = scope.limits
            limits += [lim.rpm, lim.tpm, lim.max_concurrent, lim.monthly_tokens, lim.budget]
        reply = await self._run(
            _ACQUIRE, keys, [request_id, tokens, cost, decision.WINDOW_MS, _lease_ms(), int(dry_run), *limits]
        )
        if reply[0] == -1:
            raise TotalsUnknown
        refusal, refused_by, retry, *counts = map(int, reply)
        usages = tuple(Usage(*counts[i : i + 7]) for i in range(0, len(counts), 7))
        return Decision(REFUSALS[refusal], usages, refused_by, retry)

    async def seed(self, scope: Scope, month_tokens: int, spend: int) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.seed`."""
        from redis.exceptions import RedisError

        names = self.key_names(scope)
        try:
            async with self._client()[0].pipeline(transaction=False) as pipe:
                pipe.set(names["month"], month_tokens, nx=True, ex=TOTAL_TTL_SECONDS)
                pipe.set(names["spend"], spend, nx=True, ex=TOTAL_TTL_SECONDS)
                await pipe.execute()
        except (TimeoutError, RedisError, OSError) as error:
            raise StoreUnavailable(f"{type(error).__name__}: {error}") from error

    async def settle(
        self, scopes: Sequence[Scope], request_id: str, reserved: int, used: int, reserved_cost: int, cost: int
    ) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.settle`."""
        keys = [self.key_names(scope)[n] for scope in scopes for n in _SETTLE_KEYS]
        await self._run(_SETTLE, keys, [request_id, used, reserved, cost, reserved_cost])

    async def renew(self, scopes: Sequence[Scope], request_id: str) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.renew`."""
        keys = [self.key_names(scope)["in_flight"] for scope in scopes if scope.limits.max_concurrent]
        if keys:
            await self._run(_RENEW, keys, [request_id, _lease_ms()])


def _lease_ms() -> int:
    return int(settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS * 1000)
