"""Thread policy A/B (issue 12, "Contention"): which libgomp / torch thread settings keep generation
going when the cores are shared, and what they cost on a quiet machine.

    .venv/bin/python bench/thread_policy.py                      # every variant, this CPU's own paths
    .venv/bin/python bench/thread_policy.py --avx2               # torch and oneDNN on their AVX2 paths
    .venv/bin/python bench/thread_policy.py --variants spin,passive --seconds 15 --json out.json

For each variant our server is started with that environment (on top of the caller's), warmed up, and
measured over HTTP: tokens/s of 1 stream (64 tokens) and of 8 streams (32 tokens each), first on the
quiet machine, then beside two busy loops (``python -c "while True: pass"``, killed after).  A
measurement is cut after ``--seconds``; the tokens that came count.  "kept" is busy / quiet.

The variants (``spin`` reproduces libgomp's own default: when ``OMP_WAIT_POLICY`` is unset a waiting
thread spins for 300,000 iterations before it sleeps, so the server's own default policy, which
applies only when both variables are unset, stays out of the way):

- ``spin``: ``GOMP_SPINCOUNT=300000`` (libgomp's default);
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (a waiting thread sleeps at once);
- ``spin10k``: ``GOMP_SPINCOUNT=10000`` (about 0.1 ms of spinning);
- ``threads1``: ``ENGINE_NUM_THREADS=1`` (no worker threads to wait for at all).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving import (
    ROOT,
    Bench,
    Prompts,
    contention_pair,
    cpu_info,
    cpu_line,
    load_text,
    settle,
    start_ours,
    stop_children,
    warm_up,
)

VARIANTS: dict[str, dict[str, str]] = {
    "spin": {"GOMP_SPINCOUNT": "300000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "threads1": {"GOMP_SPINCOUNT": "300000", "ENGINE_NUM_THREADS": "1"},
}
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
THREAD_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "ENGINE_NUM_THREADS", "OMP_NUM_THREADS")


async def measure(env: dict[str, str], directory: Path, prompts: Prompts, seconds: float) -> dict[str, Any]:
    server = await asyncio.to_thread(start_ours, directory, **env)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client:
            bench = Bench(server, client, None, prompts, {})  # type: ignore[arg-type]
            await warm_up(bench)
            await settle(bench, "the warm-up")
            figures = await contention_pair(bench, seconds)
            figures["notes"] = bench.notes
            return figures
    finally:
        await asyncio.to_thread(server.stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"from {','.join(VARIANTS)}")
    parser.add_argument("--avx2", action="store_true", help="ATEN_CPU_CAPABILITY=avx2 and oneDNN/MKL on AVX2")
    parser.add_argument("--seconds", type=float, default=20.0, help="cut each measurement after this long")
    parser.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from inference.model_loader import converted_gguf_dir, embedded_gguf_path

    # The caller's own thread settings would leak into every variant.
    for name in THREAD_VARIABLES:
        os.environ.pop(name, None)
    if args.avx2:
        os.environ.update(AVX2)
    cpu = cpu_info()
    print(cpu_line(cpu), flush=True)
    prompts = Prompts(
        AutoTokenizer.from_pretrained(converted_gguf_dir(embedded_gguf_path(), ROOT / ".cache" / "models"))
    )
    report: dict[str, Any] = {"cpu": cpu, "avx2_paths": args.avx2, "seconds": args.seconds, "variants": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="thread-policy-") as tmp:
            for name in args.variants.split(","):
                env = VARIANTS[name]
                load = os.getloadavg()
                print(f"{name} {env} (load average {load_text(load)}) ...", flush=True)
                started = time.perf_counter()
                directory = Path(tmp) / name
                directory.mkdir()
                figures = asyncio.run(measure(env, directory, prompts, args.seconds))
                figures.update(env=env, load_average_start=load, wall_s=time.perf_counter() - started)
                report["variants"][name] = figures
                print("  " + row(name, figures), flush=True)
    finally:
        stop_children()
    print()
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


def row(name: str, figures: dict[str, Any]) -> str:
    def tps(key: str) -> str:
        result = figures[key]
        return f"{result['tps']:.1f}" + ("c" if result["cut"] else "")

    kept = lambda key: f"{figures[key]:.2f}" if figures.get(key) is not None else "-"  # noqa: E731
    return (
        f"{name:10} {tps('quiet_1'):>8} {tps('busy_1'):>8} {kept('busy_kept_1'):>6} "
        f"{tps('quiet_8'):>8} {tps('busy_8'):>8} {kept('busy_kept_8'):>6}  load {load_text(figures['load_average_start'])}"
    )


def render(report: dict[str, Any]) -> str:
    cpu = report["cpu"]
    paths = "AVX2 paths forced (ATEN_CPU_CAPABILITY=avx2 ...)" if report["avx2_paths"] else "the CPU's own paths"
    lines = [
        cpu_line(cpu),
        f"torch on {paths}; tokens/s; 'c': cut at {report['seconds']:.0f} s; "
        "busy: beside two busy loops; kept = busy / quiet",
        "",
        f"{'variant':10} {'quiet 1':>8} {'busy 1':>8} {'kept':>6} {'quiet 8':>8} {'busy 8':>8} {'kept':>6}",
    ]
    lines += [row(name, figures) for name, figures in report["variants"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
