"""The ggml block products (inference/cpu_kernels.py's ggml_gemm) against the machine's read bandwidth.

(a) Read bandwidth: the best of several sums of a 1 GB float32 tensor, on 1 thread and on all of
torch's.  (b) Per type, products with a 1.7B model's layer shapes (N=8192 K=2048 and N=2048 K=8192,
in turn over enough distinct layers, >= 256 MB, that the weights stream from DRAM, not the cache):
at one row the time of a product and its weight bytes per second against (a), at 8, 32 and 256 rows
GFLOP/s.  ``--avx2`` forces the AVX2 code where the CPU has AVX-512; ``--bits 32`` keeps x float32
in the products of up to 4 rows (16, the engine's default, multiplies them in integers).  The
K-quants round x to 8 bits as in the engine (``ENGINE_K_QUANT_Q8_ACTIVATIONS``) unless ``--bits 32``;
``Q4_K_X8`` is Q4_K as the engine loads it, interleaved by 8 rows.

    .venv/bin/python bench/ggml_kernels.py [--avx2] [--bits 32] [--types Q4_K,Q6_K] [--threads 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference import cpu_kernels

TYPES = {
    "F32": 0,
    "F16": 1,
    "BF16": 30,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "Q4_K_X8": cpu_kernels.Q4_K_X8,  # Q4_K interleaved by 8 rows, as the engine loads it
}
SHAPES = ((8192, 2048), (2048, 8192))  # (N, K): gate/up-like and down-like
STREAM_BYTES = 256 << 20


def cpu_name() -> str:
    line = subprocess.run(["grep", "-m1", "model name", "/proc/cpuinfo"], capture_output=True, text=True).stdout
    return line.split(":", 1)[-1].strip() or "unknown CPU"


def best(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def bandwidth(threads: int) -> float:
    """GB/s reading a 1 GB float32 tensor (a sum), best of 5."""
    data = torch.ones(1 << 28)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data.sum()
        seconds = best(data.sum, 5)
    finally:
        torch.set_num_threads(before)
    return data.numel() * 4 / seconds / 1e9


def weight(ggml_type: int, rows: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """A random weight as GGUF stores it, its scales (float16) small and positive (Q4_K_X8: a Q4_K
    one interleaved)."""
    if ggml_type == cpu_kernels.Q4_K_X8:
        loaded = cpu_kernels.loaded()
        assert loaded is not None
        return loaded.interleave_q4_k(weight(12, rows, width, generator))
    block, size = cpu_kernels.GGML_BLOCKS[ggml_type]
    if block == 1:
        dtype = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}[ggml_type]
        return torch.randn(rows, width, generator=generator).to(dtype).view(torch.uint8)
    data = torch.randint(0, 256, (rows, width // block, size), dtype=torch.uint8, generator=generator)
    scales = (torch.rand(rows, width // block, 2, generator=generator) * 0.05 + 1e-3).half().view(torch.uint8)
    if ggml_type == 14:  # Q6_K: d last
        data[..., 208:210] = scales[..., :2]
    else:  # d first (then dmin or m for the types that have them)
        data[..., 0:4] = scales
    return data.reshape(rows, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--avx2", action="store_true", help="the AVX2 code even where the CPU has AVX-512")
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated ggml types")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--bits", type=int, default=16, choices=(8, 16, 32), help="activations' bits (set_activation_bits)"
    )
    args = parser.parse_args()
    kernels = cpu_kernels.load()
    if kernels is None:
        sys.exit(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    kernels.set_avx512(cpu_kernels.avx512_products() and not args.avx2)
    kernels.set_activation_bits(args.bits)
    kernels.set_k_quant_int8(True)
    torch.set_num_threads(args.threads)
    print(
        f"CPU: {cpu_name()}; AVX-512 products {'on' if kernels.avx512 else 'off'}; {args.threads} threads; "
        f"{args.bits}-bit activations"
    )
    one, every = bandwidth(1), bandwidth(args.threads)
    print(f"read bandwidth (1 GB sum, best of 5): 1 thread {one:.1f} GB/s, {args.threads} threads {every:.1f} GB/s")
    print(
        f"{'type':>5} {'bits/w':>6} {'1 row ms':>9} {'GB/s':>6} {'of bw':>6} {'8 rows GFLOP/s':>15} {'32 rows GFLOP/s':>16} {'256 rows GFLOP/s':>17}"
    )
    generator = torch.Generator().manual_seed(0)
    for name in args.types.split(","):
        block, size = cpu_kernels.GGML_BLOCKS[TYPES[name]]
        milliseconds, rate, flops = measure(kernels, TYPES[name], args.repeats, generator)
        print(
            f"{name:>5} {8 * size / block:6.2f} {milliseconds:9.3f} {rate:6.1f} {rate / every:6.0%} "
            f"{flops[8]:15.1f} {flops[32]:16.1f} {flops[256]:17.1f}"
        )


def measure(
    kernels: cpu_kernels.CPUKernels, ggml_type: int, repeats: int, generator: torch.Generator
) -> tuple[float, float, dict[int, float]]:
    """One type's products over >= 256 MB of distinct weights: ms a one-row product, its weight
    GB/s, and GFLOP/s at 8, 32 and 256 rows."""
    block, size = cpu_kernels.GGML_BLOCKS[ggml_type]
    pair_bytes = sum(n * k // block * size for n, k in SHAPES)
    layers = -(-STREAM_BYTES // pair_bytes)
    weights = [(weight(ggml_type, n, k, generator), k) for _ in range(layers) for n, k in SHAPES]
    inputs = {rows: {k: torch.randn(rows, k, generator=generator) for _, k in SHAPES} for rows in (1, 8, 32, 256)}

    def products(rows: int) -> None:
        for data, k in weights:
            kernels.ggml_gemm(inputs[rows][k], data, ggml_type)

    products(1)  # warm: the pool's threads, the pages
    seconds = {rows: best(lambda rows=rows: products(rows), repeats) for rows in (1, 8, 32, 256)}
    weights_count = layers * sum(n * k for n, k in SHAPES)
    flops = {rows: 2 * rows * weights_count / seconds[rows] / 1e9 for rows in (8, 32, 256)}
    return seconds[1] / len(weights) * 1e3, layers * pair_bytes / seconds[1] / 1e9, flops


if __name__ == "__main__":
    main()
