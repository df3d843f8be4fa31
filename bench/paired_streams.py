"""One stream's decode rate, ours against llama-server on the same GGUF file, in paired rounds.

    LLAMA_SERVER=.cache/llama.cpp/build-0.3.36/bin/llama-server .venv/bin/python bench/paired_streams.py \\
        --model .cache/bench-models/smollm2-1.7b-Q4_K_M.gguf [--rounds 10] [--tokens 128] [--threads N]

Starts both servers once (as ``bench_serving.py`` does), warms each with one request, then runs
``--rounds`` rounds of one streamed request each (a 16-token prompt, ``--tokens`` greedy tokens,
EOS forbidden), the order alternating round by round (ABBA), so that a busy neighbour who comes
and goes slows both alike.  Per round: each stream's decode rate, (tokens - 1) / (last token - first
token), their ratio (ours / llama-server), our engine's mean decode step (its
``completions_decode_step_duration_seconds`` metric) and llama-server's own eval time per token
(its log), so that a difference can be told apart as the step's or the serving's around it.
Prints the median ratio: a single run of ``bench_serving.py``'s one-stream phase moved by a tenth
between runs minutes apart on a shared 2-core machine, more than the difference it measures.
``--threads N`` runs both on N threads (``ENGINE_NUM_THREADS``, llama-server's ``-t``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_serving as serving

DEFAULT_LLAMA_SERVER = serving.ROOT / ".cache/llama.cpp/build-0.3.36/bin/llama-server"
STEP_METRIC = "completions_decode_step_duration_seconds"


async def decode_steps(client: httpx.AsyncClient, server: serving.Server) -> tuple[float, float]:
    """Our engine's decode steps so far: (seconds in all, count), from /metrics."""
    text = (await client.get(server.base_url + "/metrics", headers=server.headers)).text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(STEP_METRIC + "_sum"):
            total += float(line.split()[-1])
        elif line.startswith(STEP_METRIC + "_count"):
            count += float(line.split()[-1])
    return total, count


def llama_evals(server: serving.Server) -> list[float]:
    """llama-server's eval time per token of each request so far, from its log."""
    return [
        float(ms)
        for ms in re.findall(r"(?<!prompt) eval time = .*?\(\s*([0-9.]+) ms per token", server.log.read_text())
    ]


async def llama_eval_ms(server: serving.Server, before: int) -> float:
    """The eval time per token of the request after the first ``before``: llama-server logs it
    after the stream's last chunk, so wait for it a little (0 where it does not come)."""
    for _ in range(50):
        evals = llama_evals(server)
        if len(evals) > before:
            return evals[before]
        await asyncio.sleep(0.02)
    return 0.0


async def rounds(servers: list[serving.Server], prompts: serving.Prompts, count: int, tokens: int) -> list[float]:
    async with httpx.AsyncClient(timeout=600) as client:

        async def stream(server: serving.Server, prompt: serving.Prompt) -> tuple[float, float]:
            before = await decode_steps(client, server) if server.name == "ours" else None
            logged = len(llama_evals(server)) if before is None else 0
            deadline = asyncio.get_running_loop().time() + 300
            result = await serving.stream_once(client, server, prompt, tokens, deadline)
            if result.error or result.first is None or result.last is None or result.chunks < 2:
                raise SystemExit(f"{server.name}: {result.error or 'too few tokens'}")
            if before is None:
                step = await llama_eval_ms(server, logged)
            else:
                after = await decode_steps(client, server)
                step = (after[0] - before[0]) / max(1.0, after[1] - before[1]) * 1e3
            return (result.chunks - 1) / (result.last - result.first), step

        for server in servers:  # warm: the first request after the start is slower on both
            await stream(server, prompts.make(serving.SHORT_PROMPT))
        ratios = []
        for index in range(count):
            prompt = prompts.make(serving.SHORT_PROMPT)
            figures = {}
            for server in servers if index % 2 == 0 else servers[::-1]:
                figures[server.name] = await stream(server, prompt)
            (ours, our_step), (peer, peer_step) = figures["ours"], figures["llama-server"]
            ratios.append(ours / peer)
            print(
                f"round {index}: ours {ours:.2f} tok/s, llama-server {peer:.2f}, ratio {ratios[-1]:.3f}; "
                f"ms a token: ours {1e3 / ours:.2f} (engine step {our_step:.2f}), "
                f"llama-server {1e3 / peer:.2f} (eval {peer_step:.2f})",
                flush=True,
            )
        return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a GGUF file (bench/make_models.py makes them)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=serving.NEW_TOKENS, help="greedy tokens a stream")
    parser.add_argument("--threads", type=int, default=0, help="both servers' threads (0: their defaults)")
    args = parser.parse_args()
    if not args.model.is_file():
        parser.error(f"--model {args.model}: no such file")
    binary = os.environ.get("LLAMA_SERVER", str(DEFAULT_LLAMA_SERVER))
    serving.MODEL_FILE = args.model.resolve()
    from transformers import AutoTokenizer

    folder = serving.converted_gguf_dir(serving.embedded_gguf_path(), serving.ROOT / ".cache" / "models")
    prompts = serving.Prompts(AutoTokenizer.from_pretrained(folder), as_ids=True)
    print(serving.cpu_line(serving.cpu_info()), flush=True)
    env = {"ENGINE_NUM_THREADS": str(args.threads)} if args.threads else {}
    extra = ["-t", str(args.threads)] if args.threads else []
    directory = Path(tempfile.mkdtemp(prefix="paired-streams-"))
    servers: list[serving.Server] = []
    try:
        servers.append(serving.start_ours(directory, **env))
        servers.append(serving.start_llama_server(directory, binary, extra))
        ratios = asyncio.run(rounds(servers, prompts, args.rounds, args.tokens))
    finally:
        for server in servers:
            server.stop()
    print(
        f"median ratio ours / llama-server {statistics.median(ratios):.3f} over {len(ratios)} rounds "
        f"(lowest {min(ratios):.3f}, highest {max(ratios):.3f}); logs in {directory}"
    )


if __name__ == "__main__":
    main()
