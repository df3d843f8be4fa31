"""Counters in Redis, shared by every process and machine: one Lua script per check.

``acquire.lua``, ``settle.lua`` and ``renew.lua`` beside this module are the rules (the same as ``local.py``'s);
each runs atomically in one round trip, timed by the Redis server's clock, so the machines'
clocks do not matter.  A key's counters share the hash tag ``{<key id>}`` so that they stay on one
Redis Cluster node.
"""

from __future__ import annotations

import asyncio
import weakref
from functools import cache
from pathlib import Path
from typing import Any, Final

from django.conf import settings

from . import decision
from .decision import REFUSALS, Decision, Limits, MonthUnknown, StoreUnavailable

MONTH_TTL_SECONDS: Final = 40 * 24 * 3600  # a month counter outlives its month, then goes
_ACQUIRE, _SETTLE, _RENEW = 1, 2, 3  # indexes of the registered scripts in a client entry


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

    def key_names(self, key_id: int, month: str) -> dict[str, str]:
        """The Redis keys of ``key_id``'s counters (and of its ``month``'s quota counter)."""
        base = f"{self.prefix}{{{key_id}}}"
        return {
            "requests": f"{base}:requests",
            "tokens": f"{base}:tokens",
            "token_amounts": f"{base}:token-amounts",
            "token_sum": f"{base}:token-sum",
            "in_flight": f"{base}:in-flight",
            "month": f"{base}:month:{month}",
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
        self, key_id: int, request_id: str, limits: Limits, tokens: int, month: str, dry_run: bool
    ) -> Decision:
        """See :meth:`keys.limits.limiter.CounterStore.acquire`."""
        names = self.key_names(key_id, month)
        lease_ms = _lease_ms()
        reply = await self._run(
            _ACQUIRE,
            [names[n] for n in ("requests", "tokens", "token_amounts", "token_sum", "in_flight", "month")],
            [
                request_id,
                limits.rpm,
                limits.tpm,
                limits.max_concurrent,
                limits.monthly_tokens,
                tokens,
                decision.WINDOW_MS,
                lease_ms,
                int(dry_run),
            ],
        )
        if reply[0] == -1:
            raise MonthUnknown
        refusal, requests, used, in_flight, month_tokens, reset_requests, reset_tokens, retry = map(int, reply)
        return Decision(REFUSALS[refusal], requests, used, in_flight, month_tokens, reset_requests, reset_tokens, retry)

    async def seed_month(self, key_id: int, month: str, tokens: int) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.seed_month`."""
        from redis.exceptions import RedisError

        try:
            await self._client()[0].set(self.key_names(key_id, month)["month"], tokens, nx=True, ex=MONTH_TTL_SECONDS)
        except (TimeoutError, RedisError, OSError) as error:
            raise StoreUnavailable(f"{type(error).__name__}: {error}") from error

    async def settle(self, key_id: int, request_id: str, month: str, reserved: int, used: int) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.settle`."""
        names = self.key_names(key_id, month)
        await self._run(
            _SETTLE,
            [names[n] for n in ("token_amounts", "token_sum", "in_flight", "month")],
            [request_id, used, reserved],
        )

    async def renew(self, key_id: int, request_id: str) -> None:
        """See :meth:`keys.limits.limiter.CounterStore.renew`."""
        in_flight = self.key_names(key_id, "")["in_flight"]
        await self._run(_RENEW, [in_flight], [request_id, _lease_ms()])


def _lease_ms() -> int:
    return int(settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS * 1000)
