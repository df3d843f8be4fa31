"""One generation request's accounting: its single usage record and its admission by the key's limits.

:class:`RequestUsage` is made once a request is authenticated and finished exactly once, in every
path (answered, refused, failed, streamed, interrupted, or dropped before its first byte), writing one
:class:`keys.models.UsageRecord` with the tokens the run generated so far (through the usage journal,
:mod:`keys.journal`, so that a database outage loses none) and settling the tokens it reserved with
:mod:`keys.limits`.  A draining process waits for every open one (:mod:`api.draining`).

A stream also keeps a provisional record in the journal while it runs (:meth:`RequestUsage.progress`),
so that one cut by the death of its process is billed for what its client was sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from django.utils import timezone

from keys import journal, limits, pricing
from keys.auth import touch_last_used
from keys.errors import DatabaseUnavailable
from keys.models import APIKey

from . import draining
from .auth import admission_headers, admit, current_headers
from .errors import APIError
from .generation import Generation
from .translate import database_error

logger = logging.getLogger(__name__)

# A running stream's provisional record counts this many tokens beyond those generated, so that it
# is rewritten once per this many tokens and still never holds fewer than the client was sent.
IN_FLIGHT_AHEAD_TOKENS = 16


class RequestUsage:
    """Collects one request's accounting and writes its single usage record.

    It also holds the request's admission by the per-key limits (:mod:`keys.limits`): the tokens
    it reserved are settled to the real count in :meth:`finish`, in every path.  ``record`` is the
    usage record's fields once written (the access log reads them).
    """

    def __init__(self, api_key: APIKey, request_id: str, endpoint: str, notes: dict[str, Any] | None = None) -> None:
        self.api_key = api_key
        self.notes = {} if notes is None else notes  # the access-log fields of the request (api/access.py)
        self.request_id = request_id
        self.endpoint = endpoint
        self.started = time.monotonic()
        self.model = ""
        self.stream = False
        self.user = ""
        self.run: Generation | None = None
        self.submitted = False  # whether the engine took the request (only then are tokens charged)
        self.body_started = False  # whether a stream's body began: its 200 has reached the client
        self.written = False
        self.journaled_tokens = -1  # the completion tokens of the provisional record (-1: none yet)
        self._in_flight: asyncio.Task | None = None  # the provisional record's latest write
        self.admission: limits.Admission | None = None
        self.price = pricing.FREE  # the model's prices as of the admission
        self.limit_headers: dict[str, str] | None = None
        self.loop = asyncio.get_running_loop()
        draining.state.opened(self)  # a draining process waits for this record before it exits

    async def admit(self, run: Generation) -> None:
        """The limits hook: reserve the request's largest cost before the engine sees it, or 429
        (the key's, its user's, and the key's for :attr:`model` where it has limits for it).

        The largest cost is the prompt tokens plus ``max_tokens`` for every candidate of every
        prompt (``best_of`` candidates, which is ``n`` unless ``best_of`` is sent), and those tokens
        at the model's prices (:mod:`keys.pricing`); the record's cost uses the same prices.
        """
        largest = run.params.max_tokens * run.params.best_of * len(run.prompts)
        try:
            self.price = await pricing.aprice_of(self.model)
        except DatabaseUnavailable as error:
            raise database_error(error) from None
        cost = pricing.cost_nanos(self.price, run.prompt_tokens, largest)
        try:
            self.admission = await admit(self.api_key, self.request_id, run.prompt_tokens + largest, cost, self.model)
        except APIError as error:
            self.limit_headers = {k: v for k, v in error.headers.items() if k.startswith("x-ratelimit-")}
            raise
        self.limit_headers = admission_headers(self.admission)

    async def rate_limit_headers(self) -> dict[str, str]:
        """The key's ``x-ratelimit-*`` headers, as of this request (read, not counted, if refused early)."""
        if self.limit_headers is None:
            self.limit_headers = await current_headers(self.api_key, self.model)
        return self.limit_headers

    async def progress(self) -> None:
        """Before a stream sends a chunk: make sure its provisional record covers what the chunk carries.

        The provisional record (:func:`keys.journal.record_in_flight`) is the record written if the
        process dies before the stream ends: status 200, ``interrupted``, and the tokens generated
        so far plus :data:`IN_FLIGHT_AHEAD_TOKENS` (at most the request's ``max_tokens`` for every
        candidate).  It is rewritten only when the tokens generated pass it, so a killed stream is
        billed for at least the tokens its client was sent and at most that many more.
        """
        run = self.run
        if run is None or self.written or run.completion_tokens <= self.journaled_tokens:
            return
        largest = run.params.max_tokens * run.params.best_of * len(run.prompts)
        tokens = min(run.completion_tokens + IN_FLIGHT_AHEAD_TOKENS, largest)
        fields = self._fields(200, error_type="interrupted")
        fields["completion_tokens"] = tokens
        fields["cost_nanos"] = pricing.cost_nanos(self.price, fields["prompt_tokens"], tokens)
        self.journaled_tokens = tokens  # a write that fails is not tried again before the next step
        self._in_flight = asyncio.ensure_future(journal.record_in_flight(**fields))
        try:
            await asyncio.shield(self._in_flight)  # a cancelled stream's final record waits for it
        except Exception:
            logger.exception("Could not journal the progress of stream %s", self.request_id)

    async def finish(self, status: int, *, error_type: str = "") -> None:
        """Write the record once and settle the reservation; shielded, so a disconnect cannot cancel them.

        Tokens are recorded only for a request the engine took: one the limits refused, or the
        engine's full queue (503), never reached the engine, and costs nothing.
        """
        if self.written:
            return
        self.written = True
        fields = self._fields(status, error_type=error_type)
        self.notes["usage_record"] = fields  # what the access-log line reads
        draining.state.closed(self)
        write = draining.state.writing(_write_usage(self.api_key, fields, self.admission, after=self._in_flight))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            pass  # the shielded write goes on, and the process waits for it before it exits

    def _fields(self, status: int, *, error_type: str) -> dict[str, Any]:
        """The usage record's fields as of now (for :func:`keys.journal.record`)."""
        interrupted = error_type == "interrupted"
        run = self.run if self.submitted else None
        finish_reason = "interrupted" if interrupted else (run.finish_reasons if run else "")
        if error_type == "server_error" and not interrupted:
            finish_reason = "error"
        first = run.first_token_at if run else None
        prompt_tokens, completion_tokens = (run.prompt_tokens, run.completion_tokens) if run else (0, 0)
        return dict(
            request_id=self.request_id,
            api_key=self.api_key,
            model=self.model,
            endpoint=self.endpoint,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_nanos=pricing.cost_nanos(self.price, prompt_tokens, completion_tokens),
            stream=self.stream,
            status_code=status,
            finish_reason=finish_reason,
            error_type=error_type,
            latency_ms=(time.monotonic() - self.started) * 1000,
            time_to_first_token_ms=None if first is None else (first - self.started) * 1000,
            user=self.user,
            created_at=timezone.now(),
        )

    def __del__(self) -> None:
        # A streamed response dropped before its first byte (the client left while the middleware
        # ran) never starts its generator, so no finally of ours runs: account for it here.  So is
        # one dropped between two chunks (a disconnect while Django was sending), whose generator's
        # own finally may come after this: its client was sent the 200.
        if self.written or self.loop.is_closed():
            return
        if self.run is not None:
            self.run.abort()
        self.loop.call_soon_threadsafe(_keep_running, self.finish, 200 if self.body_started else 499)


_finishing: set[asyncio.Task] = set()


def _keep_running(finish, status: int) -> None:
    task = asyncio.ensure_future(finish(status, error_type="interrupted"))
    _finishing.add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(_finishing.discard)


async def _write_usage(
    api_key: APIKey, fields: dict, admission: limits.Admission | None, after: asyncio.Task | None = None
) -> None:
    if after is not None:
        await asyncio.wait([after])  # the provisional record's write lands first, so the final one replaces it
    try:
        written = await journal.record(**fields)  # False: it waits in the journal for the database
    except Exception:
        written = False
        logger.exception("Could not record usage for %s", fields.get("request_id"))
    try:
        if written:
            await touch_last_used(api_key)  # for humans ("is this key in use?"): skipped while the database is away
    except Exception as error:  # noqa: BLE001 - never a reason to fail the request's accounting
        logger.warning("Could not note the use of key %s: %s", api_key.prefix, error)
    finally:
        if admission is not None:
            await admission.settle(fields["prompt_tokens"] + fields["completion_tokens"], fields["cost_nanos"])
