"""The engine's thread count follows the other Python threads' load (inference/thread_budget.py)."""

import threading
import time

import pytest

from inference import thread_budget
from inference.thread_budget import ThreadBudget, python_thread_cpu_times


class FakeProcess:
    """A clock and the other threads' CPU seconds, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = {1: 0.0, 2: 0.0}

    def run(self, seconds: float, share: float, ident: int = 1) -> None:
        self.now += seconds
        self.cpu[ident] = self.cpu.get(ident, 0.0) + seconds * share


@pytest.fixture
def process():
    return FakeProcess()


def budget_for(process: FakeProcess, threads: int = 2) -> ThreadBudget:
    return ThreadBudget(threads, clock=lambda: process.now, cpu_times=lambda: dict(process.cpu))


def test_gives_a_core_back_while_the_other_threads_keep_one_busy_and_takes_it_again_when_quiet(process):
    budget = budget_for(process)
    process.run(thread_budget.INTERVAL, 0.1)
    assert budget.update() is None and budget.current == 2
    process.run(thread_budget.INTERVAL, 0.8)
    assert budget.update() == 1
    assert budget.share == pytest.approx(0.8)
    # Between the two bounds nothing changes (no flapping), in either state.
    process.run(thread_budget.INTERVAL, 0.4)
    assert budget.update() is None and budget.current == 1
    process.run(thread_budget.INTERVAL, 0.1)
    assert budget.update() == 2
    process.run(thread_budget.INTERVAL, 0.4)
    assert budget.update() is None and budget.current == 2


def test_reads_only_once_per_interval(process):
    budget = budget_for(process)
    process.run(thread_budget.INTERVAL / 2, 1.0)
    assert budget.update() is None  # too soon: not read, whatever the load
    process.run(thread_budget.INTERVAL / 2, 1.0)
    assert budget.update() == 1


def test_sums_every_thread_and_survives_threads_that_start_and_end(process):
    budget = budget_for(process)
    process.run(thread_budget.INTERVAL, 0.3, ident=1)
    process.cpu[2] += thread_budget.INTERVAL * 0.3  # two threads at 0.3 each: 0.6 of a core
    assert budget.update() == 1
    del process.cpu[1], process.cpu[2]  # both ended; a new one starts
    process.run(thread_budget.INTERVAL, 0.05, ident=3)
    assert budget.update() == 2
    assert budget.share == pytest.approx(0.05)


def test_a_new_thread_reusing_an_ended_ones_id_counts_from_its_start(process):
    process.cpu[2] = 5.0  # a long-lived thread...
    budget = budget_for(process)
    process.run(thread_budget.INTERVAL, 0.1, ident=1)
    assert budget.update() is None
    process.cpu[2] = 0.2  # ...ended, and a new one with its id has used 0.2 s since
    process.now += thread_budget.INTERVAL
    assert budget.update() == 1  # 0.2 s in 0.25 s: busy, not a negative share
    assert budget.share == pytest.approx(0.8)  # thread 1 did nothing this time


def test_one_thread_never_changes(process):
    budget = budget_for(process, threads=1)
    process.run(thread_budget.INTERVAL, 1.0)
    assert budget.update() is None and budget.current == 1


def test_reads_the_real_threads_cpu_time_without_the_callers():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    busy = threading.Thread(target=spin)
    busy.start()
    try:
        before = python_thread_cpu_times(threading.get_native_id())
        time.sleep(0.2)
        after = python_thread_cpu_times(threading.get_native_id())
    finally:
        stop.set()
        busy.join()
    assert threading.get_native_id() not in after
    assert after[busy.native_id] - before[busy.native_id] > 0.02  # it ran (the GIL shares it with others)
    assert busy.native_id not in python_thread_cpu_times(0)  # ended: no longer read
