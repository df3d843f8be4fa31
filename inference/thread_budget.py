"""How many threads the engine's kernels and torch's operations take: every core, or one fewer
while other work keeps a core of the process's CPUs busy: the process's other Python threads (the
event loop, the database threads) or other processes (a second server, a build, busy neighbours).

Many short requests keep the event loop and the database threads about one core busy, and a decode
step on every core then waits for whichever of its threads the OS put behind them; a busy process
beside the server does the same.  One thread fewer waits for nobody, while a quiet machine, or a few
streams, keeps every thread (the figures: docs/performance.md#threads-and-busy-neighbours).

:class:`ThreadBudget` reads, every :data:`INTERVAL` seconds, the CPU time of the process's Python
threads but the engine's (one ``clock_gettime`` per thread) and the CPU time that other processes
used on the process's CPUs (``/proc/stat``'s busy time on those CPUs less the process's own), and
gives one thread back while their sum stays above :data:`BUSY` of a core, taking it again below
:data:`QUIET` (hysteresis, so that the count does not flap).  The kernels' own worker threads and
torch's are not Python threads and are the engine's: they are not counted.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

INTERVAL = 0.25  # seconds between readings
BUSY = 0.5  # other work's share of one core above which the engine leaves it a core
QUIET = 0.25  # ... below which it takes the core back
PROC_STAT = "/proc/stat"
# /proc/stat's busy columns: user, nice, system, irq, softirq (not idle, iowait, steal or the guest
# columns, which user and nice already hold).
BUSY_COLUMNS = (0, 1, 2, 5, 6)
NICE_COLUMN = 1


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


def cpus_busy_seconds(cpus: frozenset[int], path: str = PROC_STAT) -> float | None:
    """CPU seconds that the CPUs ``cpus`` (their numbers) have spent busy since boot, by every
    process (niced ones only where this process is niced too), from Linux's ``/proc/stat`` (in ``USER_HZ`` ticks: 10 ms resolution); None where that
    file is missing or unreadable (not Linux), or names none of ``cpus`` (a container's own
    numbering, say).  Lines it cannot read (a ``cpufreq`` line, a column that is no number) are
    left out: an emulated ``/proc`` must not stop the engine."""
    try:
        with open(path) as stat:
            lines = stat.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    # Niced work (a build, a background job) yields its core to a thread of ours at once unless
    # this process is niced too: it counts only then.
    columns_read = (
        BUSY_COLUMNS
        if os.getpriority(os.PRIO_PROCESS, 0) > 0
        else tuple(column for column in BUSY_COLUMNS if column != NICE_COLUMN)
    )
    ticks, found = 0, False
    for line in lines:
        name, *columns = line.split() or [""]
        number = name[3:]
        if not (name.startswith("cpu") and number.isascii() and number.isdigit()) or int(number) not in cpus:
            continue
        try:
            ticks += sum(int(columns[column]) for column in columns_read if column < len(columns))
        except ValueError:
            continue
        found = True
    return ticks / os.sysconf("SC_CLK_TCK") if found else None


def other_processes_cpu_seconds(path: str = PROC_STAT) -> float | None:
    """CPU seconds other processes have used on this process's CPUs (its affinity) since boot, give
    or take ``/proc/stat``'s resolution: their busy time less this process's CPU time; None where
    the machine's busy time cannot be read."""
    busy = cpus_busy_seconds(frozenset(os.sched_getaffinity(0)), path)
    return None if busy is None else busy - time.process_time()


class ThreadBudget:
    """The engine's thread count, ``threads`` or ``threads - 1``, from other work's load.

    Call :meth:`update` from the engine's thread once per loop; it returns the count to set when it
    changes, else None.  ``threads`` below 2 never changes.  ``clock``, ``cpu_times`` and
    ``other_processes`` are for tests: ``cpu_times()`` returns ``{thread id: cpu seconds}`` as
    :func:`python_thread_cpu_times`, ``other_processes()`` a running total of seconds (or None) as
    :func:`other_processes_cpu_seconds`.
    """

    def __init__(
        self,
        threads: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu_times: Callable[[], dict[int, float]] | None = None,
        other_processes: Callable[[], float | None] = other_processes_cpu_seconds,
    ) -> None:
        self.threads = threads
        self.current = threads
        self.share = 0.0  # other work's share of one core over the last interval
        self.threads_share = 0.0  # ... of which the process's other Python threads'
        self._clock = clock
        engine = threading.get_native_id()
        self._cpu_times = cpu_times or (lambda: python_thread_cpu_times(engine))
        self._other_processes = other_processes
        self._last_time = clock()
        self._last_cpu = self._cpu_times()
        self._last_others = other_processes()

    def update(self) -> int | None:
        """The new thread count if it changes now, else None (cheap between readings)."""
        if self.threads < 2:
            return None
        now = self._clock()
        if now - self._last_time < INTERVAL:
            return None
        elapsed = now - self._last_time
        cpu = self._cpu_times()
        # A new thread counts from its start, an ended one drops out; a reading below the last one is
        # a new thread's that reuses an ended one's id.
        used = 0.0
        for ident, seconds in cpu.items():
            last = self._last_cpu.get(ident, 0.0)
            used += seconds - last if seconds >= last else seconds
        others = self._other_processes()
        used_elsewhere = 0.0
        if others is not None and self._last_others is not None:
            # /proc/stat counts in ticks and the process's time to the nanosecond: a reading a little
            # below the last is nothing.  One above what every core could do in the interval is a
            # new baseline (a CPU joined the affinity with its busy time since boot): nothing too.
            used_elsewhere = others - self._last_others
            if not 0.0 <= used_elsewhere <= elapsed * (os.cpu_count() or 1):
                used_elsewhere = 0.0
        self.threads_share = used / elapsed
        self.share = (used + used_elsewhere) / elapsed
        self._last_time, self._last_cpu, self._last_others = now, cpu, others
        wanted = self.current
        if self.share > BUSY:
            wanted = self.threads - 1
        elif self.share < QUIET:
            wanted = self.threads
        if wanted == self.current:
            return None
        self.current = wanted
        return wanted
