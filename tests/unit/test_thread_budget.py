"""The engine's thread count follows other work's load: the process's other Python threads and
other processes on its CPUs (inference/thread_budget.py)."""

import os
import subprocess
import sys
import threading
import time

import pytest

from inference import thread_budget
from inference.thread_budget import (
    ThreadBudget,
    cpus_busy_seconds,
    other_processes_cpu_seconds,
    python_thread_cpu_times,
)


class FakeProcess:
    """A clock, the other threads' CPU seconds and other processes', moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = {1: 0.0, 2: 0.0}
        self.elsewhere: float | None = 100.0

    def run(self, seconds: float, share: float, ident: int = 1, elsewhere: float = 0.0) -> None:
        """``seconds`` pass, thread ``ident`` at ``share`` of a core, other processes at ``elsewhere``."""
        self.now += seconds
        self.cpu[ident] = self.cpu.get(ident, 0.0) + seconds * share
        if self.elsewhere is not None:
            self.elsewhere += seconds * elsewhere


@pytest.fixture
def process():
    return FakeProcess()


def budget_for(process: FakeProcess, threads: int = 2) -> ThreadBudget:
    return ThreadBudget(
        threads,
        clock=lambda: process.now,
        cpu_times=lambda: dict(process.cpu),
        other_processes=lambda: process.elsewhere,
    )


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


def test_gives_a_core_back_while_other_processes_keep_one_busy(process):
    budget = budget_for(process)
    process.run(thread_budget.INTERVAL, 0.0, elsewhere=1.9)  # two busy loops, or a second server
    assert budget.update() == 1
    assert budget.share == pytest.approx(1.9) and budget.threads_share == 0.0
    process.run(thread_budget.INTERVAL, 0.0, elsewhere=0.05)  # they stopped
    assert budget.update() == 2


def test_other_processes_and_other_threads_add_up(process):
    budget = budget_for(process)
    process.run(thread_budget.INTERVAL, 0.3, elsewhere=0.3)  # neither alone is above the bound
    assert budget.update() == 1
    assert budget.share == pytest.approx(0.6) and budget.threads_share == pytest.approx(0.3)


def test_a_coarse_reading_of_other_processes_below_the_last_one_counts_as_nothing(process):
    budget = budget_for(process)
    process.elsewhere -= 0.01  # /proc/stat's ticks lag the process's own clock
    process.run(thread_budget.INTERVAL, 0.1)
    assert budget.update() is None and budget.share == pytest.approx(0.1)


def test_without_proc_stat_only_the_python_threads_count(process):
    process.elsewhere = None
    budget = budget_for(process)
    process.run(thread_budget.INTERVAL, 0.8)
    assert budget.update() == 1 and budget.share == pytest.approx(0.8)


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


def test_reads_the_busy_time_of_the_named_cpus_only(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks
    stat.write_text(
        "cpu  300 0 30 900 9 3 3 7 0 0\ncpu0 100 0 10 300 3 1 1 7 0 0\ncpu1 200 0 20 600 6 2 2 0 0 0\nintr 1 2 3\n"
    )
    ticks = os.sysconf("SC_CLK_TCK")
    assert cpus_busy_seconds(frozenset({0}), str(stat)) == pytest.approx(112 / ticks)  # not idle, iowait or steal
    assert cpus_busy_seconds(frozenset({0, 1}), str(stat)) == pytest.approx(336 / ticks)
    assert cpus_busy_seconds(frozenset({0}), str(tmp_path / "missing")) is None


@pytest.mark.parametrize("own_nice", [0, 10])
def test_niced_work_counts_only_where_this_process_is_niced_too(tmp_path, monkeypatch, own_nice):
    """A niced neighbour (a build) yields its core to our threads: its time counts only where the
    server runs niced itself, competing with it on equal terms."""
    stat = tmp_path / "stat"
    stat.write_text("cpu0 100 50 10 300 3 1 1 7 0 0\n")  # 50 ticks of niced work
    monkeypatch.setattr(os, "getpriority", lambda which, who: own_nice)
    ticks = os.sysconf("SC_CLK_TCK")
    expected = (162 if own_nice else 112) / ticks
    assert cpus_busy_seconds(frozenset({0}), str(stat)) == pytest.approx(expected)


def test_other_processes_time_is_the_cpus_busy_time_less_this_process(tmp_path):
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    busy = int(1000 * ticks)  # 1000 s on each CPU
    stat.write_text("".join(f"cpu{cpu} {busy} 0 0 0 0 0 0 0 0 0\n" for cpu in os.sched_getaffinity(0)))
    before = time.process_time()
    seconds = other_processes_cpu_seconds(str(stat))
    after = time.process_time()
    cpus = len(os.sched_getaffinity(0))
    assert cpus * 1000 - after <= seconds <= cpus * 1000 - before


def test_sees_a_busy_process_beside_this_one():
    if other_processes_cpu_seconds() is None:
        pytest.skip("no /proc/stat on this system")
    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    before = other_processes_cpu_seconds()
    subprocess.run([sys.executable, "-c", spin], check=True)
    assert other_processes_cpu_seconds() - before > 0.5  # the child's 0.6 s (and whatever else ran)


def test_lines_it_cannot_read_are_left_out_and_other_numbering_reads_as_unknown(tmp_path):
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    stat.write_text(
        "cpu  300 0 30 900 9 3 3 7 0 0\n"
        "\n"
        "cpufreq 1 2 3\n"
        "cpu0\t100 0 10 300 3 1 1 7 0 0\n"  # a tab after the name
        "cpu1 200 0 x 600 6 2 2 0 0 0\n"  # a column that is no number
        "cpu\u00b2 5 5 5 5\n"
    )
    assert cpus_busy_seconds(frozenset({0, 1}), str(stat)) == pytest.approx(112 / ticks)
    assert cpus_busy_seconds(frozenset({1}), str(stat)) is None  # its only line unreadable
    assert cpus_busy_seconds(frozenset({7}), str(stat)) is None  # named nowhere: unknown, not idle


def test_a_reading_beyond_every_cores_capacity_is_a_new_baseline_not_load(process):
    budget = budget_for(process)
    process.elsewhere += 20_000.0  # a CPU joined the affinity with its busy time since boot
    process.run(thread_budget.INTERVAL, 0.1)
    assert budget.update() is None and budget.share == pytest.approx(0.1)
    process.run(thread_budget.INTERVAL, 0.0, elsewhere=1.0)  # and from there on it counts
    assert budget.update() == 1
