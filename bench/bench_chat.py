"""Tokens/s of a chat stream and of a ``json_schema`` stream beside a plain one, in one run.

    .venv/bin/python bench/bench_chat.py [--tokens 128]

Starts our server (``testing/live_server.py``: the embedded model, bfloat16 on this CPU), then:

1. a plain ``/v1/completions`` stream alone (the baseline);
2. three streams at once: the same plain stream, a ``/v1/chat/completions`` stream, and a chat
   stream constrained by ``response_format: json_schema`` (grammar-constrained decoding).

All are greedy; the plain and chat streams ban the end-of-sequence token (``logit_bias``) so they
make exactly ``--tokens`` tokens; the constrained one asks for a list of up to 40 words, so its
grammar rather than EOS decides when it ends.  Per stream: tokens (from the usage chunk), and
decode tok/s = (tokens - 1) / (time of the last content chunk - time of the first).  The machine
is shared: the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from testing.live_server import MODEL, start_server, stop_server

NO_EOS = {"2": -100}  # <|im_end|>
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "words": {"type": "array", "items": {"type": "string"}, "minItems": 40, "maxItems": 40},
    },
    "required": ["topic", "words"],
    "additionalProperties": False,
}


def requests(tokens: int) -> dict[str, tuple[str, dict]]:
    messages = [{"role": "user", "content": "List words about the sea."}]
    common = {"model": MODEL, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    return {
        "plain": ("/completions", {**common, "prompt": "The sea is", "max_tokens": tokens, "logit_bias": NO_EOS}),
        "chat": (
            "/chat/completions",
            {**common, "messages": messages, "max_completion_tokens": tokens, "logit_bias": NO_EOS},
        ),
        "json_schema": (
            "/chat/completions",
            {
                **common,
                "messages": messages,
                "max_completion_tokens": tokens * 2,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "words", "schema": SCHEMA, "strict": True},
                },
            },
        ),
    }


def run_stream(base: str, key: str, path: str, body: dict) -> dict:
    """One stream: its token count (usage chunk) and decode tok/s over its content chunks."""
    times: list[float] = []
    usage = None
    with httpx.stream(
        "POST", base + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=600
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event["choices"]:
                piece = choice.get("text") if "text" in choice else choice.get("delta", {}).get("content")
                if piece:
                    times.append(time.perf_counter())
    tokens = usage["completion_tokens"]
    seconds = times[-1] - times[0] if len(times) > 1 else float("nan")
    return {"tokens": tokens, "tok_s": (tokens - 1) / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    work = requests(args.tokens)
    with tempfile.TemporaryDirectory() as directory:
        server = start_server(
            Path(directory), DJANGO_DEBUG="false", DJANGO_SECRET_KEY=os.urandom(24).hex(), LOG_LEVEL="WARNING"
        )
        try:
            base, key = server.api_url, server.key
            load_before = os.getloadavg()[0]
            run_stream(base, key, *work["plain"])  # warm-up
            alone = run_stream(base, key, *work["plain"])
            with ThreadPoolExecutor(3) as pool:
                futures = {name: pool.submit(run_stream, base, key, *request) for name, request in work.items()}
                together = {name: future.result() for name, future in futures.items()}
            load_after = os.getloadavg()[0]
        finally:
            stop_server(server)
    print("| stream | tokens | decode tok/s |\n| --- | --- | --- |")
    print(f"| plain, alone | {alone['tokens']} | {alone['tok_s']:.1f} |")
    for name, result in together.items():
        print(f"| {name}, 3 streams together | {result['tokens']} | {result['tok_s']:.1f} |")
    print(f"\nload average (1 min): {load_before:.1f} at the start, {load_after:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
