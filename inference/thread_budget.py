"""How many threads the engine's kernels and torch's operations take: every core, or one fewer
while the process's other Python threads (the event loop, the database threads) keep a core busy.

On 2 cores, 16 clients sending one-token requests keep the event loop and the database threads
about one core busy, and a decode step on two threads then waits for whichever of its threads the
scheduler put behind them: a step of 7 rows took 40-45 ms where it takes 15 ms alone.  The same load
served 124 requests/s with two engine threads and 158 with one (issue 12; 2-core Xeon).  A quiet
process, or a few streams, keeps every thread: one stream decodes 25% faster on two.

:class:`ThreadBudget` reads the CPU time of the process's Python threads but the engine's (one
``clock_gettime`` per thread, every :data:`INTERVAL` seconds) and gives one thread back while their
share of a core stays above :data:`BUSY`, taking it again below :data:`QUIET` (hysteresis, so that
the count does not flap).  The kernels' own worker threads and torch's are not Python threads and
are not counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

INTERVAL = 0.25  # seconds between readings
BUSY = 0.5  # the other Python threads' share of one core above which the engine leaves them a core
QUIET = 0.25  # ... below which it takes the core back


def thread_cpu_clock(native_id: int) -> int:
    """The CPU-time clock id of this process's thread ``native_id`` (Linux's encoding of a
    per-thread CPU clock: the kernel refuses it, EINVAL, for a thread that is gone or not ours).
    Built from the kernel's thread id, not with ``pthread_getcpuclockid``, which reads the thread's
    glibc structure and could read freed memory for a thread that just ended."""
    return ((~native_id) << 3) | 6  # CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED


def python_thread_cpu_times(exclude: int) -> dict[int, float]:
    """CPU seconds used so far by each live Python thread of the process but ``exclude`` (a native
    thread id), keyed by native id.  Threads that end while they are read are left out."""
    times = {}
    for thread in threading.enumerate():
        native_id = thread.native_id
        if native_id is None or native_id == exclude:
            continue
        try:
            times[native_id] = time.clock_gettime(thread_cpu_clock(native_id))
        except OSError:  # it ended meanwhile
            continue
    return times


class ThreadBudget:
    """The engine's thread count, ``threads`` or ``threads - 1``, from the other Python threads' load.

    Call :meth:`update` from the engine's thread once per loop; it returns the count to set when it
    changes, else None.  ``threads`` below 2 never changes.  ``clock`` and ``cpu_times`` are for
    tests (``cpu_times()`` returns ``{thread id: cpu seconds}`` as :func:`python_thread_cpu_times`).
    """

    def __init__(
        self,
        threads: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu_times: Callable[[], dict[int, float]] | None = None,
    ) -> None:
        self.threads = threads
        self.current = threads
        self.share = 0.0  # the other threads' share of one core over the last interval
        self._clock = clock
        engine = threading.get_native_id()
        self._cpu_times = cpu_times or (lambda: python_thread_cpu_times(engine))
        self._last_time = clock()
        self._last_cpu = self._cpu_times()

    def update(self) -> int | None:
        """The new thread count if it changes now, else None (cheap between readings)."""
        if self.threads < 2:
            return None
        now = self._clock()
        if now - self._last_time < INTERVAL:
            return None
        cpu = self._cpu_times()
        # A new thread counts from its start, an ended one drops out; a reading below the last one is
        # a new thread's that reuses an ended one's id.
        used = 0.0
        for ident, seconds in cpu.items():
            last = self._last_cpu.get(ident, 0.0)
            used += seconds - last if seconds >= last else seconds
        self.share = used / (now - self._last_time)
        self._last_time, self._last_cpu = now, cpu
        wanted = self.current
        if self.share > BUSY:
            wanted = self.threads - 1
        elif self.share < QUIET:
            wanted = self.threads
        if wanted == self.current:
            return None
        self.current = wanted
        return wanted
