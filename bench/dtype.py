"""Decode speed of the embedded model in bfloat16 against float32 on this machine, in one run.

    .venv/bin/python bench/dtype.py

Prints milliseconds per decode step for batches of 1, 8 and 32 in float32, bfloat16, and bfloat16
with oneDNN-prepacked linear layers (what the server runs on a CPU), the ratios, and whether the
greedy text of a few prompts is the same in all three (sanity of bfloat16 outputs).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inference.model_loader import converted_gguf_dir, embedded_gguf_path
from inference.packed import onednn_linear_available, prepack_linear_layers

PROMPTS = ["The weather is very nice today", "def fibonacci(n):", "The capital of France is", "Once upon a time"]


def step_ms(model, batch: int, steps: int = 20) -> float:
    ids = torch.randint(100, 1000, (batch, 16))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, cache=cache)
    started = time.perf_counter()
    for i in range(steps):
        model(input_ids=ids[:, :1], position_ids=torch.full((batch, 1), 16 + i), cache=cache)
    return (time.perf_counter() - started) / steps * 1000


def main() -> None:
    folder = converted_gguf_dir(embedded_gguf_path(), Path(".cache/models"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    kinds = {"fp32": (torch.float32, False), "bf16": (torch.bfloat16, False)}
    if onednn_linear_available():
        kinds["bf16 packed"] = (torch.bfloat16, True)
    texts, timings = {}, {}
    with torch.inference_mode():
        for kind, (dtype, packed) in kinds.items():
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
            if packed:
                prepack_linear_layers(model)
            step_ms(model, 1, 3)  # warm-up
            timings[kind] = {batch: step_ms(model, batch) for batch in (1, 8, 32)}
            texts[kind] = []
            for prompt in PROMPTS:
                ids = tokenizer(prompt, return_tensors="pt").input_ids
                out = model.generate(ids, max_new_tokens=24, do_sample=False)
                texts[kind].append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
            del model
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per decode step")
    print(
        "batch" + "".join(f"{kind:>13}" for kind in kinds) + "".join(f"{'fp32/' + k:>18}" for k in kinds if k != "fp32")
    )
    for batch in (1, 8, 32):
        row = "".join(f"{timings[kind][batch]:13.1f}" for kind in kinds)
        row += "".join(f"{timings['fp32'][batch] / timings[k][batch]:18.2f}" for k in kinds if k != "fp32")
        print(f"{batch:5d}{row}")
    for i, prompt in enumerate(PROMPTS):
        outs = {kind: texts[kind][i] for kind in kinds}
        same = len(set(outs.values())) == 1
        print(f"{prompt!r}: {'same in all' if same else 'differs'}")
        for kind, text in outs.items():
            print(f"  {kind}: {text!r}")


if __name__ == "__main__":
    main()
