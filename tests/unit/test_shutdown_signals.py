"""Which signals drain a daphne process: SIGTERM always, SIGINT where Twisted took it (Ctrl-C), not
where the process was started with SIGINT ignored (a shell's background job)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from completions_site import shutdown


class Reactor:
    """Stands in for Twisted's reactor once it installed its handlers."""

    def sigInt(self, signum, frame=None) -> None:  # Twisted's name
        raise AssertionError("not called")

    def sigTerm(self, signum, frame=None) -> None:  # Twisted's name
        raise AssertionError("not called")

    def stop(self) -> None:
        raise AssertionError("not called")

    def addSystemEventTrigger(self, *args) -> None:  # Twisted's name
        pass


@pytest.fixture
def handlers():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        asyncio.set_event_loop(None)
        loop.close()


@pytest.mark.parametrize("sigint", ["twisted", "default"])
def test_sigint_drains_where_twisted_took_it(handlers, sigint):
    reactor = Reactor()
    signal.signal(signal.SIGTERM, reactor.sigTerm)
    signal.signal(signal.SIGINT, reactor.sigInt if sigint == "twisted" else signal.default_int_handler)
    shutdown._install(reactor)

    assert getattr(signal.getsignal(signal.SIGINT), "__name__", None) == "on_signal"
    assert getattr(signal.getsignal(signal.SIGTERM), "__name__", None) == "on_signal"


def test_an_ignored_sigint_stays_ignored(handlers):
    reactor = Reactor()
    signal.signal(signal.SIGTERM, reactor.sigTerm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what Twisted leaves of a background job's SIGINT
    shutdown._install(reactor)

    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert getattr(signal.getsignal(signal.SIGTERM), "__name__", None) == "on_signal"
