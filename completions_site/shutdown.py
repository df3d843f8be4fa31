"""Graceful shutdown under daphne: SIGTERM (or Ctrl-C's SIGINT) drains the process instead of
cutting its requests off.

How daphne stops today: it runs Twisted's asyncio reactor with ``installSignalHandlers=True``, so
Twisted installs a SIGTERM handler (``reactor.sigTerm``) when the reactor starts, which calls
``reactor.stop()``; before shutting down, daphne's ``kill_all_applications`` trigger cancels every
running application instance, and ``daphne`` exits 0.  A running stream was cut off mid-token.

What this module adds: once the reactor runs (``reactor.callWhenRunning``, after Twisted installed
its handlers), :func:`install_when_served` puts :class:`Drainer`'s handler in front of Twisted's,
for SIGTERM and for SIGINT (Twisted's SIGINT stop cut streams off after daphne's application close
timeout, with neither an error event nor ``[DONE]``, and left their usage records to the next
process).  The first signal makes the process drain (``api/draining.py``): new API requests get a 503 with
``Retry-After``, ``/healthz`` a 503 ``draining``; running requests may finish for up to
``SHUTDOWN_GRACE_SECONDS``.  Then the engine stops, which ends the requests still running with
one error (an in-band event in a stream, a 503 otherwise); their usage records are written (which
frees their concurrency slots in Redis), and Twisted's own handler stops the reactor as before.
A second signal (a second Ctrl-C) skips the rest of the grace period.  A ``before shutdown`` trigger, after
daphne's, waits for the usage writes of whatever daphne's trigger cancelled.  Everything after the
grace period shares one budget, :data:`FINISH_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

# After the grace period, one budget for everything left: stopping the engine, the ended requests
# sending their error and writing their records, and the reactor's shutdown waiting for usage
# writes.  Each step gets what the earlier ones left.  Writes take milliseconds; this only bounds a
# stuck database.  A process manager's stop timeout must be SHUTDOWN_GRACE_SECONDS + FINISH_SECONDS
# and a margin (deploy/: 30 + 10 + 5 = 45 s).
FINISH_SECONDS = 10.0


def install_when_served() -> bool:
    """Under daphne, install the drain on SIGTERM and SIGINT once its reactor runs; returns whether it will.

    Elsewhere (``manage.py``, tests in one process) nothing is installed: importing Twisted's
    reactor here would install a reactor that daphne did not choose.
    """
    if "daphne.server" not in sys.modules:
        return False
    from twisted.internet import reactor

    reactor.callWhenRunning(_install, reactor)  # type: ignore[attr-defined]  # Twisted's reactor is a module-level proxy
    return True


def _install(reactor: Any) -> None:
    previous = signal.getsignal(signal.SIGTERM)

    def stop() -> None:
        if callable(previous):
            previous(signal.SIGTERM, None)  # Twisted's sigTerm: reactor.stop() from the loop
        else:
            reactor.stop()

    drainer = Drainer(asyncio.get_event_loop(), stop)
    signal.signal(signal.SIGTERM, drainer.on_signal)
    # SIGINT only where Twisted took it: one ignored (a background job of a script) stays ignored.
    if signal.getsignal(signal.SIGINT) in (getattr(reactor, "sigInt", None), signal.default_int_handler):
        signal.signal(signal.SIGINT, drainer.on_signal)
    else:
        logger.info("SIGINT is ignored (started so by the parent): stop this server with SIGTERM")
    reactor.addSystemEventTrigger("before", "shutdown", drainer.before_shutdown)


async def _flush_journal(timeout: float) -> None:
    """Give the records waiting in the usage journal a last chance; what stays is written by the
    next process to start (``keys/journal.py``)."""
    from keys.journal import get_journal

    journal = get_journal()
    if journal.backlogged and not await asyncio.to_thread(journal.wait_flushed, timeout):
        logger.warning("%d usage records wait in %s for the next process", journal.records, journal.path)


class Drainer:
    """Drains the process on the first SIGTERM or SIGINT, hurries on the second; ``stop`` ends the reactor."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
        self.loop = loop
        self.stop = stop
        self.signals = 0
        self.signal_name = "SIGTERM"  # the first signal's, for the log
        self.hurry = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.deadline: float | None = None  # the end of FINISH_SECONDS, once the grace period is over

    def left(self) -> float:
        """Seconds left of the finishing budget (all of it if the grace period is not over yet)."""
        if self.deadline is None:
            self.deadline = time.monotonic() + FINISH_SECONDS
        return max(0.0, self.deadline - time.monotonic())

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: hands the work to the event loop (signal handlers must not block)."""
        self.signals += 1
        if self.signals == 1:
            self.signal_name = signal.Signals(signum).name
            self.loop.call_soon_threadsafe(self._start)
        else:
            self.loop.call_soon_threadsafe(self.hurry.set)

    def _start(self) -> None:
        self.task = self.loop.create_task(self.drain())

    async def drain(self) -> None:
        """Stop admitting, wait out the grace period, end the rest, write every record, then stop."""
        from api import draining
        from api.engine import get_models

        state = draining.state
        grace = draining.grace_seconds()
        state.begin()
        logger.warning(
            "%s: draining %d open requests for up to %g s (send it again to end them now)",
            self.signal_name,
            state.open_requests,
            grace,
        )
        try:
            idle = await state.wait_idle(grace, self.hurry)
            self.left()  # the finishing budget starts now
            if not idle:
                reason = "a second signal" if self.hurry.is_set() else "the grace period's end"
                logger.warning("Ending %d open requests after %s", state.open_requests, reason)
                models = get_models()
                if any(engine.ready for engine in models.engines):
                    await asyncio.to_thread(models.stop, self.left())  # every running request gets an error
                await state.wait_idle(self.left())
            if not await state.wait_written(self.left()):
                logger.error("%d usage records were still being written at exit", state.pending_writes)
            await _flush_journal(self.left())
        except Exception:
            logger.exception("Draining failed; stopping anyway")
        finally:
            self.stop()

    def before_shutdown(self) -> Any:
        """A ``before shutdown`` trigger: a Deferred that fires once the cancelled requests' usage
        records (daphne's trigger cancelled them just before) are written."""
        from twisted.internet.defer import Deferred

        return Deferred.fromFuture(asyncio.ensure_future(self._written(), loop=self.loop))

    async def _written(self) -> None:
        from api import draining

        await asyncio.sleep(0.1)  # the cancelled instances run their finally blocks, which start the writes
        await draining.state.wait_idle(self.left())
        if not await draining.state.wait_written(self.left()):
            logger.error("%d usage records were still being written at exit", draining.state.pending_writes)
