"""Greedy divergence of a float16 KV cache from a float32 one, against what batching alone moves.

    .venv/bin/python bench/kv_cache_quality.py [--weights auto float32] [--tokens 128]

For each ``--weights`` (``MODEL_WEIGHTS``), the Llama runner on the embedded model, float32
activations, decodes ``bench/weight_formats.py``'s 16 prompts of 16 tokens together (one batch),
greedy, end of sequence suppressed, once with a float32 KV cache and once with a float16 one
(``ENGINE_KV_CACHE_DTYPE``), and prints how many prompts' tokens differ and where they first do.
Then, as the noise floor, the same for each prompt decoded alone against all 16 together, each
cache dtype (issue 12: ``auto`` takes float16 where our kernels run, except with float32 weights).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_serving import EOS
from bench.weight_formats import TOPICS, _prompts
from inference import model_loader
from inference.engine import EngineConfig
from inference.model_runner import PrefillChunk, build_runner


def runner(folder: Path, weights: str, kv_cache_dtype: str):
    EngineConfig().configure_kernels()  # the engine's defaults, for the load's timings
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return build_runner(
        model,
        "llama",
        32,
        weights=weights,
        cache_dir=Path(".cache/models"),
        gguf=model_loader.embedded_gguf_path(),
        drop_model_layers=True,
        kv_cache_dtype=kv_cache_dtype,
    )


def greedy(run, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """``tokens`` greedy tokens of every prompt, decoded together in one batch."""
    run.reset()
    out: list[list[int]] = []
    for key, prompt in enumerate(prompts):
        (logits,) = run.prefill([PrefillChunk(key, prompt, 0, False)])
        logits[:, EOS] = -float("inf")
        out.append([int(logits[-1].argmax())])
        run.join(key, 1)
    for _ in range(tokens - 1):
        logits = run.decode([row[-1] for row in out])
        logits[:, EOS] = -float("inf")
        for row, token in zip(out, logits.argmax(-1).tolist()):
            row.append(token)
    return out


def divergence(a: list[list[int]], b: list[list[int]]) -> str:
    firsts = [next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), None) for u, v in zip(a, b)]
    moved = sorted(first for first in firsts if first is not None)
    return f"{len(moved)} of {len(firsts)} prompts differ, first at tokens {moved}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="+", default=["auto", "float32"])
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    folder = model_loader.converted_gguf_dir(model_loader.embedded_gguf_path(), Path(".cache/models"))
    prompts = _prompts(AutoTokenizer.from_pretrained(folder), len(TOPICS)).tolist()
    print(f"torch capability {torch.backends.cpu.get_cpu_capability()}, {len(prompts)} prompts, {args.tokens} tokens")
    with torch.inference_mode():
        for weights in args.weights:
            runs = {kv: runner(folder, weights, kv) for kv in ("float32", "float16")}
            together = {kv: greedy(run, prompts, args.tokens) for kv, run in runs.items()}
            print(f"{weights}: {runs['float16'].description}")
            print(
                f"  float16 against float32 KV cache, batched: {divergence(together['float32'], together['float16'])}"
            )
            for kv, run in runs.items():
                alone = [greedy(run, [prompt], args.tokens)[0] for prompt in prompts]
                print(f"  {kv} KV cache, each prompt alone against all together: {divergence(together[kv], alone)}")


if __name__ == "__main__":
    main()
