"""Decode speed of the embedded model in bfloat16 against float32 on this machine, in one run.

    .venv/bin/python bench/dtype.py

Prints milliseconds per decode step for batches of 1, 8 and 32 in each dtype, the ratio, and
whether the greedy text of a few prompts is the same in both (sanity of bfloat16 outputs).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inference.model_loader import converted_gguf_dir, embedded_gguf_path  # noqa: E402

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
    texts, timings = {}, {}
    with torch.inference_mode():
        for dtype in (torch.bfloat16, torch.float32):
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
            step_ms(model, 1, 3)  # warm-up
            timings[dtype] = {batch: step_ms(model, batch) for batch in (1, 8, 32)}
            texts[dtype] = []
            for prompt in PROMPTS:
                ids = tokenizer(prompt, return_tensors="pt").input_ids
                out = model.generate(ids, max_new_tokens=24, do_sample=False)
                texts[dtype].append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("batch  bf16 ms/step  fp32 ms/step  fp32/bf16")
    for batch in (1, 8, 32):
        bf, fp = timings[torch.bfloat16][batch], timings[torch.float32][batch]
        print(f"{batch:5d}  {bf:12.1f}  {fp:12.1f}  {fp / bf:9.2f}")
    for prompt, bf, fp in zip(PROMPTS, texts[torch.bfloat16], texts[torch.float32]):
        print(f"{prompt!r}: {'same' if bf == fp else 'differs'}\n  bf16: {bf!r}\n  fp32: {fp!r}")


if __name__ == "__main__":
    main()
