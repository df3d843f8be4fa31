"""What the AVX2 products' activation widths cost in likelihood (``set_activation_bits``: float32,
16 bits, the engine's default, and 8 bits, ``ENGINE_Q8_ACTIVATIONS``): the embedded model's
log-likelihood of English passages, one token at a time (every product then has one row: the one-row
Q4_1 products, and the output layer's one-row Q8_0 product at 16 bits under either setting), or with ``--prefill`` each passage in one pass (every product then has as many rows
as the passage has tokens: the products of 5 rows and more, which round to 16 bits under either
setting, so the 8-bit variant is left out), and with the AVX-512 float32 products where the CPU has
them (the float32 loops' own spread, from summation order; with ``--prefill`` also the AVX-512
products with 16-bit activations, as the engine runs them from 9 rows on).  Where bfloat16 is native,
auto's q4_1 layers run passages of ``weights.BFLOAT16_PREFILL_ROWS`` tokens and more in bfloat16 on
the AVX-512 code: ``--tokens`` below it keeps the comparison to the activations' widths.

    .venv/bin/python bench/activation_bits_quality.py [--topics 30 --tokens 160] [--prefill]
    .venv/bin/python bench/activation_bits_quality.py --model .cache/bench-models/smollm2-135m-Q4_K_M.gguf

``--model GGUF``: a GGUF file read by the engine's loader instead (bench/make_models.py's ``--embedded``
files: the embedded weights re-quantized), whose K-quant products of up to 4 rows round x to 16 bits
on both codes (csrc/ggml_blocks.h's integer products), or to 8 (csrc/ggml_int8.h, the engine's
default for them, ``ENGINE_K_QUANT_Q8_ACTIVATIONS``), so AVX-512 16-bit and 8-bit are variants there too.

``--topics N`` adds the first ``--tokens`` tokens of N help topics of Python's own documentation
(``pydoc_data.topics``, on every Python install: technical English with code) to the passages.
Prints per variant: the mean negative log-likelihood per token (nats), its perplexity and its
paired change against the AVX2 float32 loop with the standard error of that change, the largest and
mean absolute change of a token's log-probability, and how often the most likely next token is the
same as that loop's.  Runs on any CPU with AVX2 (the AVX2 products are chosen directly, whatever
torch's capability).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference import cpu_kernels  # noqa: E402
from inference.engine import EngineConfig  # noqa: E402
from inference.model_loader import converted_gguf_dir, embedded_gguf_path, resolve_dtype  # noqa: E402
from inference.model_runner import PrefillChunk, build_runner  # noqa: E402

PASSAGES = [
    "The river runs through the middle of the town, and on summer evenings families walk along its "
    "banks to watch the boats come in. The old stone bridge was built more than two hundred years ago, "
    "and it still carries the market traffic every morning.",
    "To make bread, mix the flour, water, salt and yeast into a rough dough, then knead it for ten "
    "minutes until it is smooth. Leave it in a warm place to rise for an hour, shape it into a loaf, "
    "and bake it until the crust is golden and sounds hollow when tapped.",
    "Photosynthesis turns light into chemical energy. In the leaves of a plant, chlorophyll absorbs "
    "sunlight, and the plant uses that energy to combine carbon dioxide from the air with water from "
    "the soil, making sugar and releasing oxygen.",
    "def mean(values):\n    if not values:\n        raise ValueError('mean of an empty list')\n"
    "    return sum(values) / len(values)\n\nprint(mean([1, 2, 3, 4]))\n",
    "When the train finally arrived, it was forty minutes late and completely full. We stood in the "
    "corridor all the way to the coast, watching fields and small villages pass by the window, and "
    "by the time we reached the sea the sun had already started to set.",
    "A computer program is a list of instructions that a machine can follow. Programmers write these "
    "instructions in a programming language, which a compiler or an interpreter then translates into "
    "the simple operations that the processor actually performs.",
    "Regular exercise has many benefits. It strengthens the heart and lungs, helps to control weight, "
    "improves sleep, and can lift the mood. Even a short walk every day is better than no exercise "
    "at all, and it is never too late to start.",
    "The committee met on Tuesday to review the budget for the coming year. Most members agreed that "
    "the library needed new computers, but there was a long discussion about whether the park or the "
    "swimming pool should be repaired first.",
]


def load_runner(model_file: Path | None = None):
    folder = converted_gguf_dir(embedded_gguf_path(), ROOT / ".cache/models")
    EngineConfig().configure_kernels()  # the engine's defaults, for the load's timings
    kernels = cpu_kernels.load(ROOT / ".cache/models")
    if kernels is None:
        sys.exit(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    if model_file is not None:
        from inference.model_loader import ModelConfig, load_model

        config = ModelConfig(path=str(model_file), model_id="bench", cache_dir=ROOT / ".cache/models")
        checkpoint, tokenizer, _ = load_model(config, "llama")
        return build_runner(checkpoint, "llama", 1, cache_dir=ROOT / ".cache"), kernels, tokenizer
    dtype = resolve_dtype("auto", torch.device("cpu"), fused_decode=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    runner = build_runner(
        model, "llama", 1, weights="auto", cache_dir=ROOT / ".cache", gguf=embedded_gguf_path(), drop_model_layers=True
    )
    return runner, kernels, AutoTokenizer.from_pretrained(folder)


def token_logprobs(runner, ids: list[int]) -> tuple[list[float], list[int]]:
    """Log-probabilities of ids[1:] and the most likely token at each position, one token a pass."""
    runner.reset()
    chosen, best = [], []
    for position, token in enumerate(ids[:-1]):
        logits = runner.prefill([PrefillChunk(0, [token], position, True)])[0][-1].double()
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen.append(logprobs[ids[position + 1]].item())
        best.append(int(logprobs.argmax()))
    runner.release(0)
    return chosen, best


def prompt_logprobs(runner, ids: list[int]) -> tuple[list[float], list[int]]:
    """As :func:`token_logprobs`, from one pass over all of ids (their logits at every position)."""
    runner.reset()
    logprobs = torch.log_softmax(runner.prefill([PrefillChunk(0, ids, 0, True)])[0][:-1].double(), dim=-1)
    runner.release(0)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist(), logprobs.argmax(-1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=0, help="help topics of pydoc_data to add (0-79)")
    parser.add_argument("--tokens", type=int, default=160, help="tokens scored from each topic's start")
    parser.add_argument("--prefill", action="store_true", help="score each passage in one pass")
    parser.add_argument("--model", type=Path, metavar="GGUF", help="a GGUF file instead of the embedded model")
    args = parser.parse_args()
    score = prompt_logprobs if args.prefill else token_logprobs
    runner, kernels, tokenizer = load_runner(args.model)
    texts = [tokenizer.encode(passage) for passage in PASSAGES]
    if args.topics:
        from pydoc_data.topics import topics

        texts += [tokenizer.encode(topics[key])[: args.tokens + 1] for key in sorted(topics)[: args.topics]]
    print(f"{runner.description}; {len(texts)} passages, {sum(len(t) - 1 for t in texts)} scored tokens")
    variants = [
        ("AVX2 float32", False, 32),
        ("AVX2 16-bit activations", False, 16),
        ("AVX2 8-bit activations", False, 8),
    ][: 2 if args.prefill else 3]
    if cpu_kernels.avx512_products():
        # The AVX-512 products round to 16 bits from 9 rows on (32: float32 everywhere).
        variants.append(("AVX-512 float32", True, 32))
        if args.prefill or args.model:
            variants.append(("AVX-512 16-bit activations", True, 16))
        if args.model and not args.prefill:  # the K-quants' 8-bit products, with VNNI where the CPU has it
            variants.append(("AVX-512 8-bit activations", True, 8))
    results = {}
    with torch.inference_mode():
        for name, avx512, bits in variants:
            kernels.set_avx512(avx512)
            kernels.set_activation_bits(bits)
            logprobs, best = [], []
            for ids in texts:
                lp, top = score(runner, ids)
                logprobs += lp
                best += top
            results[name] = (logprobs, best)
    kernels.set_activation_bits(16)  # the default
    kernels.set_avx512(cpu_kernels.avx512_products())
    reference, reference_best = results["AVX2 float32"]
    for name, (logprobs, best) in results.items():
        nll = -sum(logprobs) / len(logprobs)
        changes = [abs(a - b) for a, b in zip(logprobs, reference)]
        same = sum(a == b for a, b in zip(best, reference_best)) / len(best)
        # The paired change of the NLL and its standard error over tokens.
        deltas = [b - a for a, b in zip(logprobs, reference)]
        mean = sum(deltas) / len(deltas)
        error = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1) / len(deltas))
        print(
            f"{name:24s} NLL {nll:.4f} nats/token (perplexity {math.exp(nll):.3f}; "
            f"change {mean:+.4f} +- {error:.4f}); "
            f"|change of a token's logprob| max {max(changes):.4f}, mean {sum(changes) / len(changes):.5f}; "
            f"same most likely token {same:.1%}"
        )


if __name__ == "__main__":
    main()
