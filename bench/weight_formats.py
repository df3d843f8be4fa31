"""Weight formats (inference/weights.py) on this CPU: matrix-product speed and greedy divergence from float32.

    .venv/bin/python bench/weight_formats.py [--rounds 2] [--tokens 128] [--threads N] [--prompts 16]
        [--isa both|native|avx2] [--skip-sweeps] [--skip-quality] [--json PATH]

Runs each measurement in a child process, once with this CPU's own kernels and once with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` (torch's and oneDNN's
AVX2 paths), alternating the two (A/B interleaved, ``--rounds`` times), and prints:

- ms per decode-like sweep: every decoder layer's products (q/k/v fused, o, gate/up fused, down: the
  embedded model's real weights, 30 distinct layers) and, apart, the output layer (49152 x 576), at
  1, 8 and 32 rows, for each format and the activation dtype its kernel computes in (best of the
  rounds, each the best of 3 sweeps after a warm-up);
- greedy divergence from float32: transformers' model with its ``nn.Linear`` layers swapped for the
  format's (int4 and q4_1 built from the GGUF's own Q4_1 blocks; the output layer, which the GGUF keeps
  as Q8_0, quantized from float32: q8_0 gives its blocks back), 16 prompts of 16 tokens decoded together for ``--tokens`` greedy tokens
  with end of sequence suppressed: how many prompts diverge, and the first diverging token (min and
  median over those that do);
- how far the int4 weights built from the Q4_1 blocks are from the float32 cache, per scale dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
TOPICS = [
    "the ocean",
    "a small town",
    "machine learning",
    "the history of Rome",
    "cooking pasta",
    "a lost key",
    "the night sky",
    "football",
    "a rainy day",
    "the stock market",
    "gardening",
    "a train journey",
    "the moon landing",
    "jazz music",
    "a mountain hike",
    "the printing press",
]
PROMPT_TOKENS = 16
REPEATS = 5
BATCHES = (1, 8, 32)
# (label, format, activation dtype of the kernel); the ones in parentheses are measured to show why
# weights.py does not use them.
VARIANTS = [
    ("float32", "float32", "float32"),
    ("bfloat16", "bfloat16", "bfloat16"),
    ("int8", "int8", "bfloat16"),
    ("(int8 f32 act)", "int8", "float32"),
    ("int4", "int4", "bfloat16"),
    ("(int4 f16 act)", "int4", "float16"),
    ("(int4 f32 act)", "int4", "float32"),
    ("q4_1 (ours)", "q4_1", "float32"),
    ("q8_0 (ours)", "q8_0", "float32"),
]


def _state():
    from safetensors.torch import load_file

    from inference.model_loader import converted_gguf_dir, embedded_gguf_path

    folder = converted_gguf_dir(embedded_gguf_path(), ROOT / ".cache" / "models")
    return folder, load_file(folder / "model.safetensors")


def _build(fmt: str, act: str, weight, blocks=None):
    import torch

    from inference import weights as w

    dtype = getattr(torch, act)
    if fmt == "int8":
        return w.Int8Linear(weight, compute_dtype=dtype)
    if fmt == "int4":
        layer = w.Int4Linear(blocks if blocks is not None else w.quantize_q4_1(weight), compute_dtype=dtype)
        layer.release_debug_copy()
        return layer
    if fmt == "q4_1":
        return w.Q4_1Linear(blocks if blocks is not None else w.quantize_q4_1(weight))
    return w.make_linear(weight, None, fmt)


def child_sweeps() -> dict:
    import torch

    from inference import weights as w

    _, state = _state()
    blocks = w.read_q4_1_blocks(__import__("inference.model_loader", fromlist=["x"]).embedded_gguf_path(), 9, 3)
    result = {
        "capability": w.cpu_capability(),
        "threads": torch.get_num_threads(),
        "supported": w.supported_formats(),
        "layers": {},
        "output": {},
    }
    groups = [("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",)]
    with torch.inference_mode():
        for label, fmt, act in VARIANTS:
            if fmt not in result["supported"]:
                continue
            dtype = getattr(torch, act)
            layers = []
            for i in range(30):
                for group in groups:
                    names = [
                        f"model.layers.{i}.{'mlp' if n in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{n}.weight"
                        for n in group
                    ]
                    weight = torch.cat([state[n] for n in names])
                    q4 = w.Q4_1Blocks.cat([blocks[n] for n in names]) if fmt in ("int4", "q4_1") else None
                    layers.append(_build(fmt, act, weight, q4))
            output = _build(fmt, act, state["model.embed_tokens.weight"])
            result["layers"][label], result["output"][label] = {}, {}
            # The variants weights.py does not use take seconds a sweep at 32 rows: 1 and 8 show why.
            for batch in BATCHES if not label.startswith("(") else BATCHES[:2]:
                xs = {k: torch.randn(batch, k, dtype=dtype) for k in (576, 1536)}
                best_layers = best_output = float("inf")
                for rep in range(REPEATS + 1):
                    t0 = time.perf_counter()
                    for layer in layers:
                        layer(xs[layer.in_features])
                    t1 = time.perf_counter()
                    output(xs[576])
                    t2 = time.perf_counter()
                    if rep or (t1 - t0) > 2.0:  # warm-up, unless one sweep already takes seconds
                        best_layers, best_output = min(best_layers, t1 - t0), min(best_output, t2 - t1)
                    if (t1 - t0) > 2.0:
                        break
                result["layers"][label][batch] = best_layers * 1000
                result["output"][label][batch] = best_output * 1000
            del layers, output
    return result


class Swapped(__import__("torch").nn.Module):
    """Stands in for an ``nn.Linear``: calls a weights.py linear."""

    def __init__(self, linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x)


TEMPLATES = [
    "Write a short paragraph about {}, for a reader who knows nothing about it yet, with care",
    "Here is what everyone should know about {}: the facts, the people, the places and the dates",
    "My grandmother once told me a long story about {} that I have never forgotten since that day",
]


def _prompts(tokenizer, count: int):
    import torch

    rows = []
    for i in range(count):
        text = TEMPLATES[i // len(TOPICS) % len(TEMPLATES)].format(TOPICS[i % len(TOPICS)])
        ids = tokenizer(text).input_ids[:PROMPT_TOKENS]
        assert len(ids) == PROMPT_TOKENS, text
        rows.append(ids)
    return torch.tensor(rows)


def child_quality(tokens: int, count: int, only: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inference import weights as w
    from inference.model_loader import embedded_gguf_path

    folder, state = _state()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    blocks = w.read_q4_1_blocks(embedded_gguf_path(), 9, 3)
    ids = _prompts(tokenizer, count)
    result = {"capability": w.cpu_capability(), "variants": {}, "int4_weights": {}}
    for dtype in ("float32", "bfloat16", "float16"):
        diff = 0.0
        for name, blk in blocks.items():
            layer = w.Int4Linear(blk, compute_dtype=getattr(torch, dtype))
            diff = max(diff, (layer.dequantized() - state[name].double()).abs().max().item())
        result["int4_weights"][dtype] = diff
    result["q4_1_dequantized_vs_cache"] = max((b.dequantize() - state[n]).abs().max().item() for n, b in blocks.items())

    def generate(label: str, fmt: str | None, act: str | None, output_fmt: str | None) -> list[list[int]]:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        if fmt is not None:
            for name, module in list(model.named_modules()):
                for child_name, child in list(module.named_children()):
                    full = f"{name}.{child_name}.weight" if name else f"{child_name}.weight"
                    if type(child) is not torch.nn.Linear:
                        continue
                    if child_name == "lm_head":
                        linear = w.make_linear(child.weight.detach(), None, output_fmt)
                    else:
                        linear = _build(fmt, act, child.weight.detach(), blocks.get(full))
                    setattr(module, child_name, Swapped(linear))
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
            )
        print(f"  {result['capability']} {label}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        return out[:, PROMPT_TOKENS:].tolist()

    reference = generate("float32", None, None, None)
    supported = w.supported_formats()
    plan = [
        ("bfloat16", "bfloat16", "bfloat16", "bfloat16"),
        ("int8", "int8", "bfloat16", "int8"),
        ("int4 (Q4_1) + int8 output", "int4", "bfloat16", "int8"),
        ("int4 (Q4_1) + float32 output", "int4", "bfloat16", "float32"),
        ("int4 (Q4_1) + bfloat16 output", "int4", "bfloat16", "bfloat16"),
        ("q4_1 (Q4_1, ours) + q8_0 output", "q4_1", "float32", "q8_0"),
    ]
    for label, fmt, act, output_fmt in plan:
        if fmt not in supported or output_fmt not in supported or (only and label not in only.split(",")):
            continue
        got = generate(label, fmt, act, output_fmt)
        firsts = [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None) for r, g in zip(reference, got)]
        diverged = [f for f in firsts if f is not None]
        result["variants"][label] = {
            "diverged": len(diverged),
            "of": len(firsts),
            "first_min": min(diverged, default=None),
            "first_median": statistics.median(diverged) if diverged else None,
        }
    return result


def run_child(mode: str, avx2: bool, tokens: int, threads: int, prompts: int = len(TOPICS), only: str = "") -> dict:
    env = dict(os.environ, **(AVX2_ENV if avx2 else {}))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--tokens", str(tokens), "--prompts", str(prompts), "--only", only],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--skip-sweeps", action="store_true")
    parser.add_argument("--prompts", type=int, default=len(TOPICS), help="greedy prompts (up to 48)")
    parser.add_argument("--only", default="", help="greedy variants to run, comma-separated labels (default: all)")
    parser.add_argument("--isa", choices=["both", "native", "avx2"], default="both")
    # On a shared machine two OpenMP threads wait for each other at every product's barrier while
    # other programs hold the cores (sweeps of 120 small products then take seconds): --threads 1
    # measures the kernels, not the scheduler.
    parser.add_argument("--threads", type=int, default=0, help="OpenMP threads of the children (0: torch's default)")
    parser.add_argument("--json", type=Path, help="also write the children's raw results here")
    parser.add_argument("--child", choices=["sweeps", "quality"])
    args = parser.parse_args()
    if args.child:
        print(
            json.dumps(
                child_sweeps() if args.child == "sweeps" else child_quality(args.tokens, args.prompts, args.only)
            )
        )
        return
    from inference.weights import cpu_model

    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    print(
        f"{cpu_model()}, {os.cpu_count()} CPUs, AVX-512 bf16: {'avx512_bf16' in flags}; load average {os.getloadavg()[0]:.1f}"
    )
    isas = {"both": (False, True), "native": (False,), "avx2": (True,)}[args.isa]
    sweeps: dict[bool, list[dict]] = {avx2: [] for avx2 in isas}
    started = time.perf_counter()
    for _ in range(0 if args.skip_sweeps else args.rounds):
        for avx2 in isas:
            sweeps[avx2].append(run_child("sweeps", avx2, args.tokens, args.threads))
            if args.json:
                args.json.write_text(json.dumps({"sweeps": {str(k): v for k, v in sweeps.items()}}))
    for avx2 in isas if not args.skip_sweeps else ():
        runs = sweeps[avx2]
        print(
            f"\n## {runs[0]['capability']} ({'AVX2 env vars' if avx2 else 'native'}), {runs[0]['threads']} threads: "
            f"ms per sweep, best of {len(runs)} rounds (load average now {os.getloadavg()[0]:.1f})"
        )
        print(
            "| format | "
            + " | ".join(f"layers b{b}" for b in BATCHES)
            + " | "
            + " | ".join(f"output b{b}" for b in BATCHES)
            + " |"
        )
        print("| --- " * (1 + 2 * len(BATCHES)) + "|")
        for label in runs[0]["layers"]:
            cells = [
                min((r[role][label][str(b)] for r in runs if str(b) in r[role][label]), default=None)
                for role in ("layers", "output")
                for b in BATCHES
            ]
            print(f"| {label} | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    print(f"\n(sweeps took {time.perf_counter() - started:.0f} s)")
    if args.skip_quality:
        return
    for avx2 in isas:
        quality = run_child("quality", avx2, args.tokens, args.threads, args.prompts, args.only)
        if args.json:
            raw = json.loads(args.json.read_text()) if args.json.exists() else {}
            raw[f"quality {quality['capability']}"] = quality
            args.json.write_text(json.dumps(raw))
        print(
            f"\n## Greedy divergence from float32, {quality['capability']}: {args.prompts} prompts x {args.tokens} tokens, batched"
        )
        print(
            f"Q4_1 blocks d*q+m vs the float32 cache: max abs diff {quality['q4_1_dequantized_vs_cache']:.3g}; int4 kernel "
            "weights vs the cache, by scale dtype: "
            + ", ".join(f"{k} {v:.3g}" for k, v in quality["int4_weights"].items())
        )
        print("| weights | prompts diverging | first diverging token (min / median) |")
        print("| --- | --- | --- |")
        for label, v in quality["variants"].items():
            print(f"| {label} | {v['diverged']} of {v['of']} | {v['first_min']} / {v['first_median']} |")


if __name__ == "__main__":
    main()
