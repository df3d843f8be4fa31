"""Decode speed of two checkouts' engines on this machine, A/B in one run (alternating processes).

    .venv/bin/python bench/engine_ab.py /work/main /work/wt-runner [--rounds 2] [--batches 1 8 32]
        [--new-tokens 64] [--scoring-requests 64]

Each round starts one process per checkout, in turn; each loads the embedded model as the server
does (``MODEL_DTYPE=auto``, so bf16 with packed layers on an AVX-512 bf16 CPU), waits until the
engine is ready, then times: the first request after ready (16-token prompt, 16 greedy tokens),
a second such request, and, per batch size B, B concurrent streams of 64 greedy tokens (decode
tokens/s over the stream, the first token excluded), and scoring: 64 requests of 160 prompt
tokens with prompt logprobs and ``max_tokens`` 0 from 8 clients (prompt tokens/s).  Prints the CPU, the torch capability and
each checkout's median figures, and the ratios B/A.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "The weather today is very nice and the people in the park are"
NEW_TOKENS = 64
SCORING_REQUESTS, SCORING_TOKENS, SCORING_CLIENTS = 64, 160, 8


def child(root: str, batches: list[int], new_tokens: int, scoring_requests: int) -> None:
    sys.path.insert(0, root)
    os.chdir(root)
    import torch

    from inference.engine import Engine, EngineConfig
    from inference.model_loader import ModelConfig
    from inference.sampling import SamplingParams

    engine = Engine(ModelConfig(path="", model_id="bench", cache_dir=Path(root) / ".cache/models"), EngineConfig())
    engine.start()
    assert engine.wait_ready(900), engine.load_error

    async def stream(ids, max_tokens):
        started, first, count = time.perf_counter(), None, 0
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        async for output in engine.submit(f"r{time.perf_counter_ns()}", ids, params):
            for candidate in output.outputs:
                count = candidate.num_tokens
                if first is None and count:
                    first = time.perf_counter()
        return started, first, time.perf_counter(), count

    async def main():
        ids = engine.encode(PROMPT)[:16]
        results = {}
        s, _, e, _ = await stream(ids, 16)
        results["first_request_s"] = e - s
        s, _, e, _ = await stream(ids, 16)
        results["second_request_s"] = e - s
        for batch in batches:
            runs = await asyncio.gather(*(stream(ids, new_tokens) for _ in range(batch)))
            first = max(r[1] for r in runs)
            end = max(r[2] for r in runs)
            results[f"decode_tok_s_b{batch}"] = sum(r[3] - 1 for r in runs) / (end - first)
        results["scoring_prompt_tok_s"] = await scoring()
        return results

    async def scoring():
        """What lm-evaluation-harness sends for log-likelihoods: echo + logprobs, max_tokens 0,
        SCORING_REQUESTS prompts of SCORING_TOKENS tokens from SCORING_CLIENTS clients."""
        text = engine.encode(" ".join(["The committee reviewed the proposal and asked for more data."] * 40))
        params = SamplingParams(max_tokens=0, logprobs=1, prompt_logprobs=True)
        per_client = scoring_requests // SCORING_CLIENTS

        async def client(c):
            for i in range(per_client):
                shift = c * per_client + i
                ids = text[shift : shift + SCORING_TOKENS]
                async for _ in engine.submit(f"s{c}-{i}", ids, params):
                    pass

        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(SCORING_CLIENTS)))
        return per_client * SCORING_CLIENTS * SCORING_TOKENS / (time.perf_counter() - started)

    results = asyncio.run(main())
    engine.stop()
    results["capability"] = torch.backends.cpu.get_cpu_capability()
    print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs="*")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--scoring-requests", type=int, default=SCORING_REQUESTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batches, args.new_tokens, args.scoring_requests)
        return
    a, b = args.roots
    figures: dict[str, list[dict]] = {a: [], b: []}
    for _ in range(args.rounds):
        for root in (a, b):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    root,
                    "--batches",
                    *map(str, args.batches),
                    "--new-tokens",
                    str(args.new_tokens),
                    "--scoring-requests",
                    str(args.scoring_requests),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            figures[root].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(root, json.dumps(figures[root][-1]), flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from inference.weights import cpu_model

    print(
        f"{cpu_model()}, {os.cpu_count()} cores, torch capability {figures[a][0]['capability']}; medians of {args.rounds} rounds"
    )
    keys = [k for k in figures[a][0] if k != "capability"]
    print(f"{'figure':<22}{'A ' + Path(a).name:>16}{'B ' + Path(b).name:>16}{'B/A':>8}")
    for key in keys:
        va = statistics.median(r[key] for r in figures[a])
        vb = statistics.median(r[key] for r in figures[b])
        print(f"{key:<22}{va:16.3f}{vb:16.3f}{vb / va:8.2f}")


if __name__ == "__main__":
    main()
