"""Per-key limits: requests and tokens per minute, concurrent requests, tokens per calendar month.

The view calls :func:`admit` once the request is validated and its prompt tokenised, before the
engine sees it.  ``admit`` checks every limit and, if all allow the request, counts it and
*reserves* its largest possible cost (prompt tokens plus ``max_tokens`` times the number of
choices) in one atomic step; :meth:`Admission.settle` later replaces the reservation with the
tokens really used and frees the concurrency slot.  So concurrent requests can never overshoot a
token limit or a quota by what they have not generated yet (LiteLLM counts tokens only after the
response, and concurrent requests overshoot).

Windows are sliding: at most ``rpm`` requests, and at most ``tpm`` tokens, in any 60 seconds.
Tokens count at the moment of their request's admission.  A refused request counts for nothing,
so ``Retry-After`` is the exact wait before the same request would be admitted.  The monthly
quota counts the tokens of the key's usage records in the calendar month (UTC) plus the
reservations in flight; its counter starts from the database (:class:`~keys.models.DailyUsage`)
the first time it is needed, so a restart or a lost Redis does not forget what was used.

Where the counters live: with ``REDIS_URL`` set, in Redis, shared by every process and machine;
each check is one Lua script (one round trip, atomic, timed by the Redis server's clock, so the
machines' clocks do not matter).  Without it, in this process (a single-process deployment).
When Redis cannot be reached, ``API_LIMITS_FAIL_MODE`` decides: ``open`` (the default) serves on,
each process enforcing the limits alone with its own counters (so N processes let through up to
N times a per-minute limit until Redis is back), and logs an error; ``closed`` answers 503.
Redis is retried after ``API_LIMITS_REDIS_RETRY_SECONDS``.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass, field
from datetime import date, datetime
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db.models import Sum
from django.dispatch import receiver

from api.errors import APIError

from .db import db_call
from .models import APIKey, DailyUsage

logger = logging.getLogger(__name__)

WINDOW_MS = 60_000
# Refusals, in the order they are checked.
QUOTA, TOO_LARGE, CONCURRENCY, REQUESTS, TOKENS = "quota", "too_large", "concurrency", "requests", "tokens"
_REFUSALS = (None, QUOTA, TOO_LARGE, CONCURRENCY, REQUESTS, TOKENS)  # as numbered by the Lua script
_MONTH_TTL_SECONDS = 40 * 24 * 3600  # a month counter outlives its month, then goes


@dataclass(frozen=True)
class Limits:
    """A key's effective limits; 0 means no limit."""

    rpm: int = 0
    tpm: int = 0
    max_concurrent: int = 0
    monthly_tokens: int = 0

    @classmethod
    def of(cls, api_key: APIKey) -> Limits:
        """The key's own limits, with the ``API_DEFAULT_*`` settings where it has none."""

        def pick(own: int | None, default: int) -> int:
            return default if own is None else own

        return cls(
            rpm=pick(api_key.rpm_limit, settings.API_DEFAULT_RPM),
            tpm=pick(api_key.tpm_limit, settings.API_DEFAULT_TPM),
            max_concurrent=pick(api_key.max_concurrent, settings.API_DEFAULT_MAX_CONCURRENT),
            monthly_tokens=pick(api_key.monthly_token_quota, settings.API_DEFAULT_MONTHLY_TOKENS),
        )


@dataclass(frozen=True)
class Decision:
    """A counter store's answer: the refusal (``None`` if admitted) and the key's usage.

    ``requests`` and ``tokens`` are the last 60 seconds' counts (this request included when
    admitted), ``concurrent`` the requests in flight, ``month_tokens`` the month's tokens (-1 when
    unknown).  The ``*_ms`` figures are waits: until every counted request (token) has left the
    window, and until this request would be admitted.
    """

    refusal: str | None
    requests: int
    tokens: int
    concurrent: int
    month_tokens: int
    reset_requests_ms: int
    reset_tokens_ms: int
    retry_after_ms: int = 0


class MonthUnknown(Exception):
    """The store has no counter for the key's month yet: seed it from the database, then retry."""


class StoreUnavailable(Exception):
    """The shared store (Redis) did not answer."""


# --- What the caller sees -----------------------------------------------------------------------


class LimitExceeded(APIError):
    """A 429: ``rate_limit_exceeded`` (``type`` requests or tokens) or ``insufficient_quota``."""


@dataclass
class Admission:
    """An admitted request's reservation; :meth:`settle` it exactly once, when the request ends."""

    store: Store
    key_id: int
    request_id: str
    month: str
    reserved: int
    headers: dict[str, str]
    settled: bool = field(default=False, init=False)

    async def settle(self, used_tokens: int) -> None:
        """Replace the reservation with ``used_tokens`` and free the concurrency slot; never raises."""
        if self.settled:
            return
        self.settled = True
        try:
            await self.store.settle(self.key_id, self.request_id, self.month, self.reserved, used_tokens)
        except Exception:
            logger.exception("Could not settle the reservation of %s", self.request_id)


async def admit(api_key: APIKey, request_id: str, tokens: int) -> Admission:
    """Count and reserve one request of up to ``tokens`` tokens, or refuse it.

    Raises :class:`LimitExceeded` (429) when a limit or the quota refuses it, and ``APIError``
    503 when Redis is down and ``API_LIMITS_FAIL_MODE`` is ``closed``.  A client that disconnects
    while the store answers leaves nothing reserved.
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


async def current_headers(api_key: APIKey) -> dict[str, str]:
    """The rate-limit headers of ``api_key`` without counting anything (responses refused early)."""
    limits = Limits.of(api_key)
    if not (limits.rpm or limits.tpm):
        return {}
    try:
        _, decision = await limiter().call("acquire", api_key.pk, "", limits, 0, current_month(), True)
    except Exception:  # noqa: BLE001 - headers are a courtesy; the limiter logged its trouble
        return {}
    return rate_limit_headers(limits, decision)


async def _admit(api_key: APIKey, request_id: str, tokens: int) -> Admission:
    limits = Limits.of(api_key)
    month = current_month()
    proc = limiter()
    for _ in range(3):
        try:
            store, decision = await proc.call("acquire", api_key.pk, request_id, limits, tokens, month, False)
        except MonthUnknown:
            used = await db_call(month_tokens_in_database, api_key.pk, month)
            await proc.call("seed_month", api_key.pk, month, used)
            continue
        headers = rate_limit_headers(limits, decision)
        if decision.refusal is not None:
            raise _refusal(decision, limits, tokens, month, headers)
        return Admission(store, api_key.pk, request_id, month, tokens, headers)
    raise APIError("The rate limiter could not count this request; try again.", status=503, type="server_error",
                   headers={"Retry-After": "1"})


def month_tokens_in_database(key_id: int, month: str) -> int:
    """Prompt plus completion tokens of the key's usage records in ``month`` (``"YYYY-MM"``, UTC)."""
    first, following = month_bounds(month)
    totals = DailyUsage.objects.filter(api_key_id=key_id, day__gte=first, day__lt=following).aggregate(
        prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    return (totals["prompt"] or 0) + (totals["completion"] or 0)


def current_month() -> str:
    return datetime.now(dt_timezone.utc).strftime("%Y-%m")


def month_bounds(month: str) -> tuple[date, date]:
    """The first day of ``month`` and of the month after it."""
    year, number = map(int, month.split("-"))
    first = date(year, number, 1)
    return first, date(year + number // 12, number % 12 + 1, 1)


# --- Headers and errors -------------------------------------------------------------------------


def format_duration(ms: int) -> str:
    """A wait as OpenAI writes it (Go's duration format): ``17ms``, ``1.5s``, ``1m0s``, ``6m0s``."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def rate_limit_headers(limits: Limits, decision: Decision) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers; a dimension without a limit has none."""
    headers: dict[str, str] = {}
    dimensions = [("requests", limits.rpm, decision.requests, decision.reset_requests_ms),
                  ("tokens", limits.tpm, decision.tokens, decision.reset_tokens_ms)]
    for name, limit, _, _ in dimensions:
        if limit:
            headers[f"x-ratelimit-limit-{name}"] = str(limit)
    for name, limit, used, _ in dimensions:
        if limit:
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, limit - used))
    for name, limit, _, reset in dimensions:
        if limit:
            headers[f"x-ratelimit-reset-{name}"] = format_duration(reset)
    return headers


def _refusal(decision: Decision, limits: Limits, tokens: int, month: str, headers: dict[str, str]) -> LimitExceeded:
    wait = decision.retry_after_ms
    retry = {"Retry-After": str(max(1, math.ceil(wait / 1000))), "retry-after-ms": str(max(1, wait))}
    final = {"x-should-retry": "false"}  # the official clients retry every 429 unless told not to
    if decision.refusal == QUOTA:
        _, renewal = month_bounds(month)
        return LimitExceeded(
            f"You exceeded your current quota: this API key may use {limits.monthly_tokens} tokens per calendar "
            f"month, {decision.month_tokens} are used and this request needs up to {tokens} (prompt tokens plus "
            f"max_tokens for each choice). The quota renews on {renewal.isoformat()} (UTC).",
            status=429, type="insufficient_quota", code="insufficient_quota", headers={**headers, **final},
        )
    if decision.refusal == TOO_LARGE:
        return LimitExceeded(
            f"Request too large for tokens per min (TPM) on this API key: Limit {limits.tpm}, Requested {tokens}. "
            "Reduce the prompt or max_tokens (each choice reserves max_tokens) to run it.",
            status=429, type="tokens", code="rate_limit_exceeded", headers={**headers, **final},
        )
    if decision.refusal == CONCURRENCY:
        return LimitExceeded(
            f"Rate limit reached for concurrent requests on this API key: Limit {limits.max_concurrent}, "
            f"Used {decision.concurrent}, Requested 1. Please try again once one of them has finished.",
            status=429, type="requests", code="rate_limit_exceeded", headers={**headers, **retry},
        )
    if decision.refusal == REQUESTS:
        name, limit, used, requested = "requests per min (RPM)", limits.rpm, decision.requests, 1
    else:
        name, limit, used, requested = "tokens per min (TPM)", limits.tpm, decision.tokens, tokens
    return LimitExceeded(
        f"Rate limit reached for {name} on this API key: Limit {limit}, Used {used}, Requested {requested}. "
        f"Please try again in {format_duration(wait)}.",
        status=429, type=decision.refusal, code="rate_limit_exceeded", headers={**headers, **retry},
    )


def limiter_unavailable_error() -> APIError:
    return APIError(
        "The rate limiter is unavailable, so requests are refused for now; try again shortly.",
        status=503, type="server_error", code="limiter_unavailable",
        headers={"Retry-After": str(math.ceil(settings.API_LIMITS_REDIS_RETRY_SECONDS))},
    )


# --- Counter stores -----------------------------------------------------------------------------


class Store:
    """Where counters live. Both stores implement the same rules; ``tests/test_rate_limits.py`` runs
    one specification against both."""

    async def acquire(self, key_id: int, request_id: str, limits: Limits, tokens: int, month: str,
                      dry_run: bool) -> Decision:
        """Check every limit and, unless refused (or ``dry_run``), count the request and reserve
        ``tokens``. Raises :class:`MonthUnknown` when the month's counter is missing."""
        raise NotImplementedError

    async def seed_month(self, key_id: int, month: str, tokens: int) -> None:
        """Start the month's counter at ``tokens`` unless another process started it first."""
        raise NotImplementedError

    async def settle(self, key_id: int, request_id: str, month: str, reserved: int, used: int) -> None:
        raise NotImplementedError


@dataclass
class _KeyCounters:
    requests: collections.deque = field(default_factory=collections.deque)  # admission times, ms
    tokens: dict[str, list[int]] = field(default_factory=dict)  # request_id -> [ms, tokens], oldest first
    token_sum: int = 0
    in_flight: dict[str, int] = field(default_factory=dict)  # request_id -> lease end, ms


class LocalStore(Store):
    """Counters in this process's memory, for one process alone (or while Redis is down)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[int, _KeyCounters] = collections.defaultdict(_KeyCounters)
        self._months: dict[tuple[int, str], int] = {}

    @staticmethod
    def _now() -> int:
        return int(time.monotonic() * 1000)

    async def acquire(self, key_id, request_id, limits, tokens, month, dry_run):
        with self._lock:
            return self._acquire(key_id, request_id, limits, tokens, month, dry_run)

    def _acquire(self, key_id: int, request_id: str, limits: Limits, tokens: int, month: str,
                 dry_run: bool) -> Decision:
        now = self._now()
        cutoff = now - WINDOW_MS
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
        if month_tokens is None and not dry_run:
            raise MonthUnknown
        refusal, retry = None, 0
        if not dry_run:
            refusal, retry = self._refusal(counters, limits, tokens, month_tokens, now)
        if refusal is None and not dry_run:
            if limits.rpm:
                counters.requests.append(now)
            if limits.tpm:
                counters.tokens[request_id] = [now, tokens]
                counters.token_sum += tokens
            if limits.max_concurrent:
                counters.in_flight[request_id] = now + settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS * 1000
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
            reset_requests_ms=0 if newest_request is None else newest_request + WINDOW_MS - now,
            reset_tokens_ms=0 if newest_tokens is None or not counters.token_sum else newest_tokens + WINDOW_MS - now,
            retry_after_ms=retry,
        )

    @staticmethod
    def _refusal(counters: _KeyCounters, limits: Limits, tokens: int, month_tokens: int, now: int):
        if limits.monthly_tokens and month_tokens + tokens > limits.monthly_tokens:
            return QUOTA, 0
        if limits.tpm and tokens > limits.tpm:
            return TOO_LARGE, 0
        if limits.max_concurrent and len(counters.in_flight) >= limits.max_concurrent:
            return CONCURRENCY, 1000
        if limits.rpm and len(counters.requests) >= limits.rpm:
            freeing = counters.requests[len(counters.requests) - limits.rpm]
            return REQUESTS, max(1, freeing + WINDOW_MS - now)
        if limits.tpm and counters.token_sum + tokens > limits.tpm:
            needed = counters.token_sum + tokens - limits.tpm
            for ms, amount in counters.tokens.values():
                needed -= amount
                if needed <= 0:
                    return TOKENS, max(1, ms + WINDOW_MS - now)
            return TOKENS, WINDOW_MS
        return None, 0

    async def seed_month(self, key_id, month, tokens):
        with self._lock:
            self._months.setdefault((key_id, month), tokens)

    async def settle(self, key_id, request_id, month, reserved, used):
        with self._lock:
            counters = self._keys[key_id]
            counters.in_flight.pop(request_id, None)
            held = counters.tokens.get(request_id)
            if held is not None:
                counters.token_sum += used - held[1]
                held[1] = used
            if (key_id, month) in self._months:
                self._months[(key_id, month)] += used - reserved


# KEYS: 1 requests (zset id->ms), 2 tokens (zset id->ms), 3 token amounts (hash id->tokens),
# 4 token sum, 5 in flight (zset id->lease end), 6 month counter.
# ARGV: request id, rpm, tpm, max concurrent, monthly tokens, tokens, window ms, lease ms, dry run.
# Returns {refusal (0 none, 1 quota, 2 too large, 3 concurrency, 4 requests, 5 tokens), requests,
# tokens, in flight, month tokens (-1 unknown), reset requests ms, reset tokens ms, retry ms},
# or {-1} when the month counter must be seeded first.  LocalStore._acquire is the same in Python.
_ACQUIRE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local id = ARGV[1]
local rpm, tpm, concurrency, monthly = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens, window, lease, dry_run = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9] == '1'
local cutoff = now - window

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
local requests = redis.call('ZCARD', KEYS[1])

local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff)
if #expired > 0 then
  local freed = 0
  for first = 1, #expired, 500 do
    local batch = {unpack(expired, first, math.min(first + 499, #expired))}
    for _, amount in ipairs(redis.call('HMGET', KEYS[3], unpack(batch))) do
      freed = freed + (tonumber(amount) or 0)
    end
    redis.call('HDEL', KEYS[3], unpack(batch))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cutoff)
  redis.call('DECRBY', KEYS[4], freed)
end
local used_tokens = tonumber(redis.call('GET', KEYS[4]) or '0')

redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local in_flight = redis.call('ZCARD', KEYS[5])

local month = redis.call('GET', KEYS[6])
if not month and not dry_run then return {-1} end
month = tonumber(month or '-1')

local refusal, retry = 0, 0
if not dry_run then
  if monthly > 0 and month + tokens > monthly then
    refusal = 1
  elseif tpm > 0 and tokens > tpm then
    refusal = 2
  elseif concurrency > 0 and in_flight >= concurrency then
    refusal, retry = 3, 1000
  elseif rpm > 0 and requests >= rpm then
    local freeing = redis.call('ZRANGE', KEYS[1], requests - rpm, requests - rpm, 'WITHSCORES')
    refusal, retry = 4, math.max(1, tonumber(freeing[2]) + window - now)
  elseif tpm > 0 and used_tokens + tokens > tpm then
    refusal, retry = 5, window
    local needed, offset = used_tokens + tokens - tpm, 0
    while needed > 0 do
      local entries = redis.call('ZRANGE', KEYS[2], offset, offset + 99, 'WITHSCORES')
      if #entries == 0 then break end
      for i = 1, #entries, 2 do
        needed = needed - (tonumber(redis.call('HGET', KEYS[3], entries[i])) or 0)
        if needed <= 0 then
          retry = math.max(1, tonumber(entries[i + 1]) + window - now)
          break
        end
      end
      offset = offset + 100
    end
  end
end

if refusal == 0 and not dry_run then
  if rpm > 0 then
    redis.call('ZADD', KEYS[1], now, id)
    redis.call('PEXPIRE', KEYS[1], window)
    requests = requests + 1
  end
  if tpm > 0 then
    redis.call('ZADD', KEYS[2], now, id)
    redis.call('HSET', KEYS[3], id, tokens)
    redis.call('INCRBY', KEYS[4], tokens)
    for k = 2, 4 do redis.call('PEXPIRE', KEYS[k], window) end
    used_tokens = used_tokens + tokens
  end
  if concurrency > 0 then
    redis.call('ZADD', KEYS[5], now + lease, id)
    redis.call('PEXPIRE', KEYS[5], lease)
    in_flight = in_flight + 1
  end
  month = redis.call('INCRBY', KEYS[6], tokens)
end

local reset_requests, reset_tokens = 0, 0
if requests > 0 then
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  reset_requests = tonumber(newest[2]) + window - now
end
if used_tokens > 0 then
  local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if #newest > 0 then reset_tokens = tonumber(newest[2]) + window - now end
end
return {refusal, requests, used_tokens, in_flight, month, reset_requests, reset_tokens, retry}
"""

# KEYS: 1 token amounts, 2 token sum, 3 in flight, 4 month counter. ARGV: request id, used, reserved.
_SETTLE = """
redis.call('ZREM', KEYS[3], ARGV[1])
local used, reserved = tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], used)
  redis.call('INCRBY', KEYS[2], used - tonumber(held))
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('INCRBY', KEYS[4], used - reserved)
end
return 1
"""


class RedisStore(Store):
    """Counters in Redis, shared by every process; one Lua script per check (see the module doc).

    A key's counters share the hash tag ``{<key id>}`` so that they stay on one Redis Cluster node.
    """

    def __init__(self, url: str, prefix: str, timeout: float) -> None:
        self.url = url
        self.prefix = prefix
        self.timeout = timeout
        # redis.asyncio connections belong to the event loop that opened them.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, Any, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def key_names(self, key_id: int, month: str) -> dict[str, str]:
        base = f"{self.prefix}{{{key_id}}}"
        return {
            "requests": f"{base}:requests",
            "tokens": f"{base}:tokens",
            "token_amounts": f"{base}:token-amounts",
            "token_sum": f"{base}:token-sum",
            "in_flight": f"{base}:in-flight",
            "month": f"{base}:month:{month}",
        }

    def _client(self) -> tuple[Any, Any, Any]:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is None:
            from redis.asyncio import Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            # One quick retry (a pooled connection may have gone stale), no backoff: a Redis that
            # is down must cost a request a fraction of a second, not several.
            client = Redis.from_url(
                self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 1),
            )
            entry = (client, client.register_script(_ACQUIRE), client.register_script(_SETTLE))
            self._clients[loop] = entry
        return entry

    async def _run(self, script_index: int, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import RedisError

        try:
            return await self._client()[script_index](keys=keys, args=args)
        except (TimeoutError, RedisError, OSError) as error:
            raise StoreUnavailable(f"{type(error).__name__}: {error}") from error

    async def acquire(self, key_id, request_id, limits, tokens, month, dry_run):
        names = self.key_names(key_id, month)
        lease_ms = int(settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS * 1000)
        reply = await self._run(
            1,
            [names[n] for n in ("requests", "tokens", "token_amounts", "token_sum", "in_flight", "month")],
            [request_id, limits.rpm, limits.tpm, limits.max_concurrent, limits.monthly_tokens, tokens,
             WINDOW_MS, lease_ms, int(dry_run)],
        )
        if reply[0] == -1:
            raise MonthUnknown
        refusal, requests, used, in_flight, month_tokens, reset_requests, reset_tokens, retry = map(int, reply)
        return Decision(_REFUSALS[refusal], requests, used, in_flight, month_tokens, reset_requests,
                        reset_tokens, retry)

    async def seed_month(self, key_id, month, tokens):
        from redis.exceptions import RedisError

        try:
            await self._client()[0].set(self.key_names(key_id, month)["month"], tokens, nx=True,
                                        ex=_MONTH_TTL_SECONDS)
        except (TimeoutError, RedisError, OSError) as error:
            raise StoreUnavailable(f"{type(error).__name__}: {error}") from error

    async def settle(self, key_id, request_id, month, reserved, used):
        names = self.key_names(key_id, month)
        await self._run(2, [names[n] for n in ("token_amounts", "token_sum", "in_flight", "month")],
                        [request_id, used, reserved])


class Limiter:
    """This process's way to the counters: Redis when configured and reachable, else its own.

    After a Redis failure it logs one error and leaves Redis alone for
    ``API_LIMITS_REDIS_RETRY_SECONDS``, serving from :class:`LocalStore` (fail open) or refusing
    with 503 (fail closed) in the meantime.
    """

    def __init__(self) -> None:
        self.local = LocalStore()
        self.redis = (
            RedisStore(settings.REDIS_URL, settings.API_LIMITS_REDIS_PREFIX, settings.API_LIMITS_REDIS_TIMEOUT)
            if settings.REDIS_URL else None
        )
        self.fail_open = settings.API_LIMITS_FAIL_MODE == "open"
        self._redis_down_until = 0.0

    async def call(self, method: str, *args: Any) -> tuple[Store, Any]:
        """``store.method(*args)`` on the store in charge now; returns ``(store, result)``."""
        if self.redis is not None and time.monotonic() >= self._redis_down_until:
            try:
                return self.redis, await getattr(self.redis, method)(*args)
            except StoreUnavailable as error:
                self._redis_down_until = time.monotonic() + settings.API_LIMITS_REDIS_RETRY_SECONDS
                logger.error(
                    "Redis at %s is unavailable (%s): %s for the next %s s",
                    _redacted(self.redis.url),
                    error,
                    "each process enforces the limits alone (fail open)" if self.fail_open
                    else "requests are refused with 503 (fail closed)",
                    settings.API_LIMITS_REDIS_RETRY_SECONDS,
                )
        if self.redis is not None and not self.fail_open:
            raise limiter_unavailable_error()
        return self.local, await getattr(self.local, method)(*args)


def _redacted(url: str) -> str:
    """``url`` without its password, for the log."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return scheme + sep + rest


_SETTINGS = {"REDIS_URL", "API_LIMITS_REDIS_PREFIX", "API_LIMITS_REDIS_TIMEOUT", "API_LIMITS_FAIL_MODE",
             "API_LIMITS_REDIS_RETRY_SECONDS"}


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
