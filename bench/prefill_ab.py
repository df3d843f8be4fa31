"""Milliseconds per prefill pass of the Llama runner with its attention kernel and with torch's operations.

    .venv/bin/python bench/prefill_ab.py [--rounds 7]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python bench/prefill_ab.py

The runner is built as the engine builds it (``build_runner``, ``MODEL_WEIGHTS=auto``, the autotune's
cached choice), once; each pass then runs with ``CPUKernels.prefill_attention`` (``fused``) or with
the runner's torch path (rotary embeddings, cache copies and casts, masks and SDPA: ``torch``), the two
taking turns within each round (A/B interleaved in one process, so a busy neighbour slows both
alike).  Cases: one 512-token prompt (the issue's idle TTFT), 16 new prompts of 16 tokens (the
16-client requests/s load), 8 of 160 (scoring), and 256 tokens after 256 cached (a continued chunk).
Printed per case: the median ms of each, fused / torch, and the largest difference of their logits
(float16 rounding of the cache and 16-bit activations move near-ties; the tests bound the kernel itself).
The second line runs torch's, oneDNN's and our kernels' AVX2 code on an AVX-512 machine (issue 12).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inference import cpu_kernels, llama
from inference.engine import EngineConfig
from inference.model_loader import converted_gguf_dir, embedded_gguf_path, resolve_dtype
from inference.model_runner import PrefillChunk, build_runner

CASES = ((512, 1, 0), (16, 16, 0), (160, 8, 0), (256, 1, 256))  # (tokens, prompts, cached before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cache = Path(".cache")
    with torch.inference_mode():
        EngineConfig().configure_kernels()  # the engine's defaults, for the load's timings
        kernels = cpu_kernels.load(cache / "models") is not None
        dtype = resolve_dtype("auto", torch.device("cpu"), fused_decode=kernels)
        model = AutoModelForCausalLM.from_pretrained(
            converted_gguf_dir(embedded_gguf_path(), cache / "models"), dtype=dtype
        )
        runner = build_runner(
            model.eval(),
            "llama",
            32,
            weights="auto",
            cache_dir=cache,
            gguf=embedded_gguf_path(),
            drop_model_layers=True,
        )
        runner.warm_up()
        if not runner._prefill_attention_fits():
            sys.exit(f"the prefill attention kernel does not run here ({runner.description})")
        print(
            f"capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads: {runner.description}"
        )
        fits = llama.LlamaModelRunner._prefill_attention_fits

        def once(tokens: int, prompts: int, cached: int, fused: bool) -> tuple[float, list[torch.Tensor]]:
            llama.LlamaModelRunner._prefill_attention_fits = fits if fused else (lambda self: False)  # type: ignore[method-assign]
            keys = range(1000, 1000 + prompts)
            if cached:
                runner.prefill([PrefillChunk(key, list(range(200, 200 + cached)), 0, False) for key in keys])
            chunks = [PrefillChunk(key, list(range(100 + key, 100 + key + tokens)), cached, False) for key in keys]
            started = time.perf_counter()
            logits = runner.prefill(chunks)
            elapsed = time.perf_counter() - started
            for key in keys:
                runner.release(key)
            return elapsed, logits

        try:
            for tokens, prompts, cached in CASES:
                times: dict[bool, list[float]] = {True: [], False: []}
                logits: dict[bool, list[torch.Tensor]] = {}
                for r in range(args.rounds):
                    for fused in (True, False) if r % 2 else (False, True):
                        elapsed, logits[fused] = once(tokens, prompts, cached, fused)
                        times[fused].append(elapsed)
                difference = max((a - b).abs().max().item() for a, b in zip(logits[True], logits[False]))
                fused_ms, torch_ms = (statistics.median(times[f]) * 1000 for f in (True, False))
                print(
                    f"{prompts} x {tokens} tokens after {cached}: torch {torch_ms:.1f} ms, fused {fused_ms:.1f} ms, "
                    f"fused / torch {fused_ms / torch_ms:.3f}, max |logits difference| {difference:.1e}"
                )
        finally:
            llama.LlamaModelRunner._prefill_attention_fits = fits  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
