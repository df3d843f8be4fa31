"""Graceful shutdown's state: whether this process still admits requests, and what it still owes.

On SIGTERM (``completions_site/shutdown.py`` installs the handler) the process *drains*: new API
requests get a 503 with ``Retry-After`` (:func:`refusal`), ``/healthz`` says ``draining``, and the
requests already running may finish.  :data:`state` counts what the process still owes before it
may exit: every API request from its arrival until its response's last byte is sent
(:meth:`DrainState.serving`, entered by ``api/access.py``), every generation request whose usage
record is not yet written (each registers its ``RequestUsage``, ``api/accounting.py``), and every
usage write still in flight (which also releases the request's concurrency slot and settles its tokens
in the limits' store).

Everything here runs on the server's one event loop; nothing is locked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Awaitable, Iterator
from typing import Any

from django.conf import settings

from .errors import APIError

RETRY_AFTER_SECONDS = 1  # another process (behind the proxy) or this one's successor answers soon


class DrainState:
    """What a draining process waits for: open requests and usage writes in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.since: float | None = None
        # Weak: a streamed response dropped before its first byte is accounted for by its RequestUsage's
        # __del__, which a strong reference here would keep from ever running.
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()  # requests being served
        self._unrecorded: weakref.WeakSet[Any] = weakref.WeakSet()  # their usage records not yet begun
        self._writes: set[asyncio.Future] = set()

    def begin(self) -> None:
        """Stop admitting; idempotent."""
        if not self.draining:
            self.draining = True
            self.since = time.monotonic()

    def opened(self, usage: Any) -> None:
        """A request that will write a usage record has started."""
        self._unrecorded.add(usage)

    def closed(self, usage: Any) -> None:
        """Its usage record is being written (:meth:`writing` tracks the write itself)."""
        self._unrecorded.discard(usage)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """An API request from its arrival until its response's last byte is sent (``api/access.py``)."""
        request = _Serving()
        self._open.add(request)
        try:
            yield
        finally:
            self._open.discard(request)

    def writing(self, write: Awaitable[None]) -> asyncio.Future:
        """Run ``write`` as a task the process waits for before it exits; returns the task."""
        task = asyncio.ensure_future(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    @property
    def open_requests(self) -> int:
        """API requests being served (one each, from arrival to the last byte)."""
        return len(self._open)

    @property
    def pending_writes(self) -> int:
        return len(self._writes)

    def idle(self) -> bool:
        """Nothing is running and every usage record is written."""
        return not self._open and not self._unrecorded and not self._writes

    async def wait_idle(self, timeout: float, interrupt: asyncio.Event | None = None) -> bool:
        """Wait until :meth:`idle`, ``timeout`` seconds pass or ``interrupt`` is set; returns :meth:`idle`."""
        deadline = time.monotonic() + timeout
        while not self.idle() and time.monotonic() < deadline:
            if interrupt is not None and interrupt.is_set():
                break
            await asyncio.sleep(0.05)
        return self.idle()

    async def wait_written(self, timeout: float) -> bool:
        """Wait until every usage write in flight has finished (or ``timeout``); returns whether they did."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=timeout)
        return not self._writes


class _Serving:
    """One request being served (a weakly referable token)."""


state = DrainState()


def refusal_error() -> APIError:
    """The 503 a draining process answers new API requests with, in OpenAI's error shape."""
    return APIError(
        "The server is shutting down; retry the request.",
        status=503,
        type="server_error",
        code="server_shutting_down",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def grace_seconds() -> float:
    """How long running requests may go on after SIGTERM (``SHUTDOWN_GRACE_SECONDS``)."""
    return float(settings.SHUTDOWN_GRACE_SECONDS)
