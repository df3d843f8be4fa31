"""Milliseconds per decode step of two checkouts' Llama runners, interleaved in one process.

    OMP_WAIT_POLICY=PASSIVE nice .venv/bin/python bench/runner_ab.py /work/main . [--batches 1 8] [--rounds 21]
        [--steps 4] [--context 150] [--weights auto] [--dtype auto] [--threads 1]

Each checkout's ``inference`` package is imported in turn (then renamed in ``sys.modules``, so the
two coexist) and builds its runner as the engine does (``build_runner``, ``MODEL_WEIGHTS`` from
``--weights``, ``MODEL_DTYPE`` from ``--dtype``: bfloat16 activations on a CPU with AVX-512 bf16,
float32 elsewhere; the autotune's cached choice, the GGUF's Q4_1 blocks), warmed up.  Per batch size,
rounds alternate A and B (the order flipping every round), each timing ``--steps`` decode steps;
printed: the median ms per step of each, B/A, the minimum of each, and the largest difference of
their logits on one step from the same cache.  On a machine shared with other processes the
medians move together, and B/A is the figure to read (an engine-level A/B is bench/engine_ab.py).
Add ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` for the AVX2
paths on an AVX-512 CPU (issue 12).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def _build(root: str, tag: str, weights: str, max_batch: int, dtype: str):
    """Root's runner and its PrefillChunk; its modules are left in sys.modules as ``{tag}_inference...``."""
    sys.path.insert(0, root)
    try:
        model_runner = importlib.import_module("inference.model_runner")
        loader = importlib.import_module("inference.model_loader")
        importlib.import_module("inference.llama")
        folder = loader.converted_gguf_dir(loader.embedded_gguf_path(), Path(".cache/models"))
        with torch.inference_mode():
            engine_config = importlib.import_module("inference.engine").EngineConfig()
            if hasattr(engine_config, "configure_kernels"):  # the engine's defaults, for the load's timings
                engine_config.configure_kernels()
            kernels = importlib.import_module("inference.cpu_kernels").load(Path(".cache/models")) is not None
            activations = loader.resolve_dtype(dtype, torch.device("cpu"), fused_decode=kernels)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=activations).eval()
            runner = model_runner.build_runner(
                model,
                "llama",
                max_batch,
                weights=weights,
                cache_dir=Path(".cache"),
                gguf=loader.embedded_gguf_path(),
                drop_model_layers=True,
            )
            runner.warm_up()
        return runner, model_runner.PrefillChunk
    finally:
        for name in [n for n in sys.modules if n == "inference" or n.startswith("inference.")]:
            sys.modules[f"{tag}_{name}"] = sys.modules.pop(name)
        sys.path.remove(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--context", type=int, default=150)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--dtype", default="auto", help="activations (MODEL_DTYPE): auto is the server's choice")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0: torch's default); 1 is steadier beside busy neighbours",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    roots = [str(Path(root).resolve()) for root in args.roots]
    os.chdir(roots[1])  # .cache (models, autotune) is read from B's checkout
    built = {tag: _build(root, tag, args.weights, max(args.batches), args.dtype) for tag, root in zip("AB", roots)}
    runners = {tag: runner for tag, (runner, _) in built.items()}
    chunk = built["A"][1]
    torch.manual_seed(0)
    prompt = torch.randint(100, 40000, (args.context,)).tolist()
    print(f"A {roots[0]}: {runners['A'].description}")
    print(f"B {roots[1]}: {runners['B'].description}")
    print(
        f"capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, "
        f"context {args.context}, median of {args.rounds} rounds x {args.steps} steps"
    )
    with torch.inference_mode():
        for batch in args.batches:
            for runner in runners.values():
                runner.reset()
                runner.prefill([chunk(0, prompt, 0, False)])
                runner.join(0, batch)
                runner.decode([7] * batch)
            times: dict[str, list[float]] = {tag: [] for tag in runners}
            for round_ in range(args.rounds):
                for tag in "AB" if round_ % 2 == 0 else "BA":
                    started = time.perf_counter()
                    for _ in range(args.steps):
                        runners[tag].decode([7] * batch)
                    times[tag].append((time.perf_counter() - started) * 1000 / args.steps)
            a, b = statistics.median(times["A"]), statistics.median(times["B"])
            logits = {}
            for tag, runner in runners.items():
                runner.reset()
                runner.prefill([chunk(0, prompt, 0, False)])
                runner.join(0, batch)
                logits[tag] = runner.decode([7] * batch)
            difference = (logits["A"] - logits["B"]).abs().max().item()
            print(
                f"batch {batch}: A {a:.2f} ms, B {b:.2f} ms, B/A {b / a:.3f} "
                f"(min A {min(times['A']):.2f}, B {min(times['B']):.2f}); max |logits A - B| {difference:.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
