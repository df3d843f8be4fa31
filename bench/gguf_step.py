"""Milliseconds per decode step of a GGUF file on the Llama runner, by the K-quants' activation width.

    .venv/bin/python bench/gguf_step.py .cache/bench-models/smollm2-1.7b-Q4_K_M.gguf [--rows 1 4 8] [--rounds 5]
    .venv/bin/python bench/gguf_step.py FILE --per-operation   # the one-call step against per-operation calls

Loads the file as the engine does (its blocks as stored), prefills each row with a 16-token prompt,
then times decode steps at each row count with the K-quant products' x rounded to 8 bits
(``ENGINE_K_QUANT_Q8_ACTIVATIONS``, the default) and to 16, interleaved within each round so that a
busy neighbour slows both alike; prints the median step of each and their ratio, and the weights'
bytes per token against the step (GB/s).  ``--per-operation`` times the whole step as one kernel call
(``CPUKernels.decode_layers``) against the same step's per-operation calls instead.  Run it under ``nice`` on a shared machine and quote the
ratio, not the milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference import cpu_kernels  # noqa: E402
from inference.engine import EngineConfig  # noqa: E402
from inference.model_loader import ModelConfig, load_model  # noqa: E402
from inference.model_runner import PrefillChunk, build_runner  # noqa: E402

STEPS = 16  # timed decode steps a variant a round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a GGUF file")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-operation", action="store_true", help="the one-call step against per-operation calls")
    args = parser.parse_args()
    cpu = subprocess.run(["grep", "-m1", "model name", "/proc/cpuinfo"], capture_output=True, text=True).stdout
    print(f"CPU: {cpu.split(':', 1)[-1].strip()}; {torch.get_num_threads()} threads")
    config = ModelConfig(path=str(args.model), model_id="bench", cache_dir=ROOT / ".cache/models")
    EngineConfig().configure_kernels()  # the engine's defaults, for the load's timings
    checkpoint, _, _ = load_model(config, "llama")
    runner = build_runner(checkpoint, "llama", max(args.rows), cache_dir=ROOT / ".cache")
    kernels = cpu_kernels.loaded()
    if kernels is None:
        sys.exit(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    kernels.set_activation_bits(16)
    weight_bytes = args.model.stat().st_size
    print(runner.description)
    with torch.inference_mode():
        for rows in args.rows:
            runner.reset()
            for key in range(rows):
                runner.prefill([PrefillChunk(key, list(range(100, 116)), 0, False)])
                runner.join(key, 1)
            times: dict[bool, list[float]] = {True: [], False: []}
            whole_step_table = runner._whole_step_table
            if args.per_operation:  # the engine's default products
                kernels.set_k_quant_int8(True)
            for _ in range(args.rounds):
                for int8 in (True, False):
                    if args.per_operation:  # True: the one call; False: per operation
                        runner._whole_step_table = whole_step_table if int8 else lambda _: None
                    else:
                        kernels.set_k_quant_int8(int8)
                    runner.decode([5] * rows)  # the first after a switch: warm
                    started = time.perf_counter()
                    for _ in range(STEPS):
                        runner.decode([5] * rows)
                    times[int8].append((time.perf_counter() - started) / STEPS)
            eight, sixteen = statistics.median(times[True]), statistics.median(times[False])
            if args.per_operation:
                print(
                    f"{rows} rows: one call {eight * 1e3:.1f} ms, per operation {sixteen * 1e3:.1f} ms; "
                    f"per operation / one call {sixteen / eight:.3f}"
                )
                continue
            print(
                f"{rows} rows: 8-bit {eight * 1e3:.1f} ms ({weight_bytes / eight / 1e9:.1f} GB/s), "
                f"16-bit {sixteen * 1e3:.1f} ms ({weight_bytes / sixteen / 1e9:.1f} GB/s); 16/8 {sixteen / eight:.2f}"
            )
    kernels.set_k_quant_int8(True)


if __name__ == "__main__":
    main()
