"""Microseconds the engine's metrics add to one decode step, in-process and in multiprocess mode.

    nice .venv/bin/python bench/metrics_cost.py [--batch 32] [--steps 20000]

What ``Engine._decode_step`` and ``Engine._set_gauges`` do per step on one engine's metrics (its
children, labelled with its ``model_name``: one histogram observation,
one counter increment by the batch size, three gauges set from the batch: a set of request ids
and a sum of lengths over ``--batch`` fake sequences), timed over ``--steps`` steps; then the same
in a child process with ``PROMETHEUS_MULTIPROC_DIR`` set (values in mmapped files).  Compare
with a decode step: tens of milliseconds on a CPU (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(batch: int, steps: int) -> float:
    """Mean microseconds of one step's metric updates."""
    from inference.metrics import EngineMetrics

    m = EngineMetrics("bench")  # one engine's children, bound once, as Engine binds its own

    class Seq:
        def __init__(self, i: int) -> None:
            self.request = object() if i % 2 else None
            self.length = 100 + i

    running = [Seq(i) for i in range(batch)]
    started = time.perf_counter()
    for _ in range(steps):
        t = time.monotonic()
        m.generation_tokens.inc(len(running))
        m.decode_step_duration.observe(time.monotonic() - t)
        m.requests_running.set(len({id(seq.request) for seq in running}))
        m.requests_waiting.set(0)
        m.kv_cache_columns.set(sum(seq.length for seq in running))
    return (time.perf_counter() - started) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(f"{measure(args.batch, args.steps):.2f}")
        return
    print(f"in-process:   {measure(args.batch, args.steps):.2f} us per step (batch {args.batch})")
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--batch", str(args.batch), "--steps", str(args.steps)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    print(f"multiprocess: {out} us per step (batch {args.batch})")


if __name__ == "__main__":
    main()
