"""How often bfloat16 batching changes a greedy token, measured on the benchmark's kind of prompts.

    .venv/bin/python bench/batch_invariance.py [--dtype bfloat16|float32] [--tokens 128]

Runs 16 different prompts through the engine one at a time, then all at once (one batch), greedy,
end of sequence suppressed, and prints how many completions differ and where they first diverge.
In float32 none should; in bfloat16 a near-tie can flip when the batch around a request changes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inference.engine import Engine, EngineConfig
from inference.model_loader import ModelConfig
from inference.sampling import SamplingParams

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


async def complete(engine: Engine, request_id: str, prompt: str, params: SamplingParams) -> list[int]:
    tokens: list[int] = []
    async for output in engine.submit(request_id, engine.encode(prompt), params):
        for candidate in output.outputs:
            tokens.extend(candidate.token_ids)
    return tokens


async def main(dtype: str, max_tokens: int) -> None:
    engine = Engine(
        ModelConfig(path="", model_id="bench", dtype=dtype, cache_dir=Path(".cache/models")), EngineConfig()
    )
    engine.start()
    assert engine.wait_ready(600), engine.load_error
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    prompts = [f"Write a short paragraph about {topic}." for topic in TOPICS]
    alone = [await complete(engine, f"a{i}", p, params) for i, p in enumerate(prompts)]
    together = await asyncio.gather(*(complete(engine, f"b{i}", p, params) for i, p in enumerate(prompts)))
    differ = 0
    for prompt, a, b in zip(prompts, alone, together):
        if a != b:
            differ += 1
            first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            print(f"differs at token {first:3d}: {prompt!r}")
    print(
        f"{dtype}: {differ} of {len(prompts)} greedy completions of {max_tokens} tokens differ between alone "
        f"and a batch of {len(prompts)}"
    )
    engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    asyncio.run(main(args.dtype, args.tokens))
