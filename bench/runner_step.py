"""Milliseconds per decode step and per 512-token prefill: transformers' modeling against LlamaModelRunner.

    nice -n 10 .venv/bin/python bench/runner_step.py [--rounds 5] [--batches 1 8 32] [--context 150]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 nice -n 10 .venv/bin/python bench/runner_step.py

The second line makes torch, oneDNN and MKL take their AVX2 paths on an AVX-512 machine (issue 12).
On a shared machine add ``OMP_WAIT_POLICY=PASSIVE``: spinning OpenMP threads of a process that
neighbours preempt make every variant 10-50 times slower and the comparison meaningless.

Variants, on the embedded model: ``hf fp32`` (transformers' forward as the engine calls it today:
``BatchKVCache``, attention mask, position ids), ``hf bf16 packed`` (the engine's bfloat16 with
oneDNN-packed layers, where the CPU has them), ``llama fp32`` and ``llama bf16`` (LlamaModelRunner;
bf16 uses packed weights where oneDNN has bf16, plain ``F.linear`` otherwise).  Every batch size
runs the variants in turn within each round (A/B interleaved, so a busy neighbour slows all alike)
and prints the median over rounds.  Then the greedy continuations of a few prompts under each
variant, against transformers' float32 greedy tokens (past end-of-text too): the first token where each differs.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inference.kv_cache import BatchKVCache
from inference.llama import LlamaModelRunner
from inference.model_loader import converted_gguf_dir, embedded_gguf_path
from inference.model_runner import PrefillChunk
from inference.packed import onednn_linear_available, prepack_linear_layers
from inference.weights import cpu_model

PROMPTS = [
    "The weather is very nice today",
    "def fibonacci(n):",
    "The capital of France is",
    "Once upon a time",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
]
GREEDY_TOKENS = 32
print = functools.partial(print, flush=True)


class HFVariant:
    """transformers' forward with the engine's left-padded cache and mask, one row's cache repeated."""

    def __init__(self, model) -> None:
        self.model = model

    def start(self, prompt: list[int], rows: int) -> torch.Tensor:
        single = BatchKVCache(self.model.config)
        output = self.model(input_ids=torch.tensor([prompt]), cache=single, use_cache=True, logits_to_keep=1)
        self.cache = BatchKVCache(self.model.config)
        self.cache.join(single, torch.zeros(rows, dtype=torch.long))
        self.rows, self.length = rows, len(prompt)
        self.mask = torch.ones(rows, self.length, dtype=torch.long)
        return output.logits[:, -1].float()

    def step(self, tokens: list[int]) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long)], 1)
        output = self.model(
            input_ids=torch.tensor(tokens)[:, None],
            attention_mask=self.mask,
            position_ids=torch.full((self.rows, 1), self.length),
            cache=self.cache,
            use_cache=True,
        )
        self.length += 1
        return output.logits[:, -1].float()

    def prefill_only(self, prompt: list[int]) -> None:
        self.model(
            input_ids=torch.tensor([prompt]), cache=BatchKVCache(self.model.config), use_cache=True, logits_to_keep=1
        )

    def greedy(self, prompt: list[int], tokens: int) -> list[int]:
        out = [int(self.start(prompt, 1)[0].argmax())]
        while len(out) < tokens:
            out.append(int(self.step(out[-1:])[0].argmax()))
        return out


class RunnerVariant:
    """LlamaModelRunner: one prefill, then ``rows`` copies of its cache."""

    def __init__(self, runner: LlamaModelRunner) -> None:
        self.runner = runner

    def start(self, prompt: list[int], rows: int) -> None:
        self.runner.reset()
        self.runner.prefill([PrefillChunk(0, prompt, 0, False)])
        self.runner.join(0, rows)

    def step(self, tokens: list[int]) -> torch.Tensor:
        return self.runner.decode(tokens)

    def prefill_only(self, prompt: list[int]) -> None:
        self.runner.prefill([PrefillChunk(1, prompt, 0, False)])
        self.runner.release(1)

    def greedy(self, prompt: list[int], tokens: int) -> list[int]:
        self.runner.reset()
        (logits,) = self.runner.prefill([PrefillChunk(0, prompt, 0, False)])
        self.runner.join(0, 1)
        out = [int(logits[-1].argmax())]
        while len(out) < tokens:
            out.append(int(self.runner.decode(out[-1:])[0].argmax()))
        self.runner.reset()
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="decode steps timed per round")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=int, default=150)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--no-greedy", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    folder = converted_gguf_dir(embedded_gguf_path(), Path(".cache/models"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    packed = onednn_linear_available()
    with torch.inference_mode():
        fp32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
        variants = {"hf fp32": HFVariant(fp32)}
        if packed:
            bf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
            prepack_linear_layers(bf16)
            variants["hf bf16 packed"] = HFVariant(bf16)
        started = time.perf_counter()
        variants["llama fp32"] = RunnerVariant(LlamaModelRunner(fp32, torch.float32, max_batch_size=max(args.batches)))
        variants["llama bf16"] = RunnerVariant(LlamaModelRunner(fp32, torch.bfloat16, max_batch_size=max(args.batches)))
        built = time.perf_counter() - started
        started = time.perf_counter()
        for variant in variants.values():
            if isinstance(variant, RunnerVariant):
                variant.runner.warm_up()
        warmed = time.perf_counter() - started
        print(
            f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"{torch.get_num_threads()} threads, oneDNN bf16 linear: {packed}"
        )
        print(f"{_cpu_name()}; runners built in {built:.1f} s, warmed up in {warmed:.1f} s")
        for name, variant in variants.items():
            if isinstance(variant, RunnerVariant):
                print(f"  {name}: {variant.runner.description}")
        prompt = torch.randint(100, 40000, (args.context,)).tolist()
        print(
            f"\nms per decode step, context {args.context} tokens, median of {args.rounds} rounds x {args.steps} steps"
            " (in brackets: CPU ms of the process, all threads: what a step costs when neighbours take the cores)"
        )
        print("batch" + "".join(f"{name:>17}" for name in variants) + f"{'hf/llama fp32':>15}")
        for batch in args.batches:
            times: dict[str, list[float]] = {name: [] for name in variants}
            cpu: dict[str, list[float]] = {name: [] for name in variants}
            for variant in variants.values():
                variant.start(prompt, batch)
                variant.step([7] * batch)  # a first step outside the timing
            for _ in range(args.rounds):
                for name, variant in variants.items():
                    started, cpu_started = time.perf_counter(), time.process_time()
                    for _ in range(args.steps):
                        variant.step([7] * batch)
                    times[name].append((time.perf_counter() - started) / args.steps * 1000)
                    cpu[name].append((time.process_time() - cpu_started) / args.steps * 1000)
            medians = {name: statistics.median(values) for name, values in times.items()}
            cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
            row = "".join(f"{medians[name]:9.1f} ({cpu_medians[name]:5.0f})" for name in variants)
            print(f"{batch:5d}{row}{medians['hf fp32'] / medians['llama fp32']:15.2f}")
            for variant in variants.values():
                if isinstance(variant, RunnerVariant):
                    variant.runner.reset()
        long_prompt = torch.randint(100, 40000, (args.prefill,)).tolist()
        times = {name: [] for name in variants}
        for round_ in range(max(2, args.rounds // 2) + 1):
            for name, variant in variants.items():
                started = time.perf_counter()
                variant.prefill_only(long_prompt)
                if round_:  # the first round warms the shapes
                    times[name].append((time.perf_counter() - started) * 1000)
        print(f"\nms per prefill of {args.prefill} tokens (median)")
        print("".join(f"{name:>16}" for name in variants))
        print("".join(f"{statistics.median(times[name]):16.0f}" for name in variants))
        if not args.no_greedy:
            _greedy_report(tokenizer, variants)


def _greedy_report(tokenizer, variants) -> None:
    """First position where each variant's greedy tokens differ from transformers' float32 ones."""
    print(
        f"\ngreedy divergence over {GREEDY_TOKENS} tokens against hf fp32 (index of the first differing token, '-' = none)"
    )
    print(f"{'prompt':<34}" + "".join(f"{name:>16}" for name in variants))
    reference = variants["hf fp32"]
    for text in PROMPTS:
        ids = tokenizer.encode(text)
        expected = reference.greedy(ids, GREEDY_TOKENS)
        cells = []
        for variant in variants.values():
            got = variant.greedy(ids, GREEDY_TOKENS)
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
            cells.append("-" if first is None else str(first))
        print(f"{text[:32]!r:<34}" + "".join(f"{cell:>16}" for cell in cells))


def _cpu_name() -> str:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    kind = "AVX-512 bf16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2"
    return f"{cpu_model()} ({kind} in its flags)"


if __name__ == "__main__":
    main()
