"""Two models in one process (``MODELS_CONFIG``): the throughput of each while the other is busy,
against each alone.

    make bench-models                                   # installs bench/requirements.txt, then the run
    make bench-models BENCH_ARGS="--quick --json out.json"
    .venv/bin/python bench/bench_models.py --second /models/Llama-3.2-1B-Instruct-Q4_K_M.gguf
    .venv/bin/python bench/bench_models.py --streams 8 --tokens 128 --seconds 30

One daphne server (``testing/live_server.py``: its own SQLite database and key) serves two models,
each by its own engine: ``first`` (the embedded SmolLM2 unless ``--first`` names a GGUF file) and
``second`` (``--second``'s GGUF file, else the embedded file again: two engines of one size).  The
weight formats are the server's defaults (``MODEL_WEIGHTS=auto``) unless the environment names one.

Each round measures, for ``--seconds`` each: the first model alone, the second alone, both at once,
the second alone, the first alone (ABBA: the two alone figures of a model are averaged, so that a
shared machine's drift over the round weighs on both sides alike).  A load is ``--streams``
concurrent streamed clients per model, each sending its next request as soon as one ends, every
request ``--tokens`` new tokens at temperature 0 with the model's end-of-generation tokens kept
from being sampled (read from its GGUF file), so that each makes exactly ``--tokens``.

Figures, per model: *tok/s*, the tokens that arrived within the load's window over the window (a
request still streaming when it closes is cut; two loads at once share one window); *TTFT p50*,
the median time to the first token of its requests.  *kept* is the model's tok/s beside
the other's load over its tok/s alone; *sum* is both models' tok/s together over the better alone.
On a machine of few cores the two engines share the cores (docs/configuration.md#several-models):
expect each to keep about half of its alone figure, and the sum near one model's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference.formats.gguf import GGUFFile  # noqa: E402
from inference.model_loader import embedded_gguf_path, end_of_generation_ids  # noqa: E402
from testing.live_server import start_server, stop_server  # noqa: E402

PROMPTS = (
    "Write a short story about a lighthouse keeper who",
    "The three most important inventions of the last century are",
    "Explain to a child why the sky is blue:",
    "Once upon a time, in a village by the sea,",
)
MODELS_TOML = """
[[models]]
id = "first"
path = "{first}"

[[models]]
id = "second"
path = "{second}"
"""


@dataclass
class Load:
    """One model's figures over one load: tokens received, the load's seconds, each request's TTFT."""

    tokens: int = 0
    seconds: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def ttft_p50(self) -> float | None:
        return statistics.median(self.ttfts) if self.ttfts else None


@dataclass
class Model:
    """A served model: its id and the ``logit_bias`` that keeps its end-of-generation tokens away."""

    id: str
    path: Path
    bias: dict[str, int]

    @classmethod
    def of(cls, model_id: str, path: Path) -> Model:
        return cls(model_id, path, {str(token): -100 for token in end_of_generation_ids(GGUFFile(path))})


async def stream(
    client: httpx.AsyncClient, url: str, headers: dict, model: Model, prompt: str, tokens: int, stop_at: float
) -> tuple[int, float | None, str | None]:
    """One streamed request, cut at ``stop_at`` (``time.monotonic()``): ``(tokens received, TTFT
    seconds, error)``.  Our server sends a chunk per token; a stream that ends counts its usage."""
    body = {
        "model": model.id,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "logit_bias": model.bias,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, first, received = time.monotonic(), None, 0
    try:
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + (stop_at - sent)):
            async with client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    return 0, None, f"HTTP {response.status_code}: {(await response.aread())[:160]!r}"
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        return received, first, f"in-band error: {event['error'].get('message', '')[:160]}"
                    if any(choice.get("text") for choice in event.get("choices") or []):
                        received += 1
                        first = time.monotonic() - sent if first is None else first
                    if event.get("usage"):
                        received = event["usage"]["completion_tokens"]
    except TimeoutError:
        pass  # the load's window closed: what came in it counts
    return received, first, None


async def load(
    client: httpx.AsyncClient, url: str, headers: dict, model: Model, streams: int, tokens: int, seconds: float
) -> Load:
    """``streams`` clients sending ``model`` requests back to back for ``seconds``: the tokens that
    arrive within the window, over the window (two loads at once share the same window)."""
    result, stop_at = Load(seconds=seconds), time.monotonic() + seconds

    async def client_loop(index: int) -> None:
        turn = 0
        while time.monotonic() < stop_at:
            prompt = PROMPTS[(index + turn) % len(PROMPTS)]
            received, ttft, error = await stream(client, url, headers, model, prompt, tokens, stop_at)
            result.tokens += received
            if ttft is not None:
                result.ttfts.append(ttft)
            if error:
                result.errors.append(error)
                return
            turn += 1

    await asyncio.gather(*(client_loop(index) for index in range(streams)))
    return result


async def measure(base_url: str, headers: dict, models: list[Model], args: argparse.Namespace) -> dict[str, Any]:
    """The rounds' figures: each model alone (twice, ABBA) and both together."""
    url = base_url + "/v1/completions"
    limits = httpx.Limits(max_connections=4 * args.streams + 4)
    first, second = models
    rounds = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        warm = [load(client, url, headers, model, 1, 8, 2.0) for model in models]
        await asyncio.gather(*warm)  # the first requests' one-time costs stay out of the figures
        for _ in range(args.rounds):
            figures: dict[str, Any] = {}
            run = lambda model: load(client, url, headers, model, args.streams, args.tokens, args.seconds)  # noqa: E731
            figures["first_alone_a"] = await run(first)
            figures["second_alone_a"] = await run(second)
            together = await asyncio.gather(run(first), run(second))
            figures["first_together"], figures["second_together"] = together
            figures["second_alone_b"] = await run(second)
            figures["first_alone_b"] = await run(first)
            rounds.append(figures)
    return summarize(rounds, models)


def summarize(rounds: list[dict[str, Load]], models: list[Model]) -> dict[str, Any]:
    report: dict[str, Any] = {"models": {}, "errors": sorted({e for r in rounds for f in r.values() for e in f.errors})}
    for name in ("first", "second"):
        alone = [statistics.mean([r[f"{name}_alone_a"].tps, r[f"{name}_alone_b"].tps]) for r in rounds]
        together = [r[f"{name}_together"].tps for r in rounds]
        ttft_alone = [t for r in rounds for key in ("a", "b") for t in r[f"{name}_alone_{key}"].ttfts]
        ttft_together = [t for r in rounds for t in r[f"{name}_together"].ttfts]
        report["models"][name] = {
            "path": str(next(m.path for m in models if m.id == name)),
            "tps_alone": statistics.mean(alone),
            "tps_together": statistics.mean(together),
            "kept": statistics.mean(together) / statistics.mean(alone) if statistics.mean(alone) else None,
            "ttft_p50_alone": statistics.median(ttft_alone) if ttft_alone else None,
            "ttft_p50_together": statistics.median(ttft_together) if ttft_together else None,
        }
    both = report["models"]
    best_alone = max(both["first"]["tps_alone"], both["second"]["tps_alone"])
    total = both["first"]["tps_together"] + both["second"]["tps_together"]
    report["sum_together"] = total
    report["sum_over_best_alone"] = total / best_alone if best_alone else None
    return report


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 1000:.0f} ms"

    lines = [
        f"{args.streams} streams per model, {args.tokens} tokens each, {args.seconds:g} s per load, {args.rounds} round(s)",
        f"{'model':<8} {'tok/s alone':>12} {'beside the other':>17} {'kept':>6} {'TTFT p50 alone':>15} {'beside':>8}",
    ]
    for name, figures in report["models"].items():
        kept = "n/a" if figures["kept"] is None else f"{figures['kept']:.0%}"
        lines.append(
            f"{name:<8} {figures['tps_alone']:>12.1f} {figures['tps_together']:>17.1f} {kept:>6} "
            f"{ms(figures['ttft_p50_alone']):>15} {ms(figures['ttft_p50_together']):>8}"
        )
    ratio = report["sum_over_best_alone"]
    lines.append(
        f"both together: {report['sum_together']:.1f} tok/s"
        + ("" if ratio is None else f", {ratio:.2f} times the better model alone")
    )
    for path_name, figures in report["models"].items():
        lines.append(f"  {path_name}: {figures['path']}")
    if report["errors"]:
        lines.append("errors: " + "; ".join(report["errors"]))
    lines.append(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=Path, help="the first model's GGUF file (default: the embedded one)")
    parser.add_argument("--second", type=Path, help="the second model's GGUF file (default: the first's file again)")
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams per model (default 4)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request (default 64)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per load (default 20)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of five loads (default 1)")
    parser.add_argument("--quick", action="store_true", help="2 streams of 16 tokens, 3 s per load: a smoke run")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.tokens, args.seconds, args.rounds = 2, 16, 3.0, 1
    # Absolute: MODELS_CONFIG's relative paths are its own directory's, a temporary one here.
    first_path = (args.first or embedded_gguf_path()).resolve()
    second_path = args.second.resolve() if args.second else first_path
    models = [Model.of("first", first_path), Model.of("second", second_path)]
    with tempfile.TemporaryDirectory(prefix="bench-models-") as directory:
        config = Path(directory) / "models.toml"
        config.write_text(MODELS_TOML.format(first=models[0].path, second=models[1].path))
        print(f"Starting one server with two models ({config}) ...", flush=True)
        live = start_server(
            Path(directory),
            MODELS_CONFIG=str(config),
            MODEL_WEIGHTS=os.environ.get("MODEL_WEIGHTS", "auto"),
            DJANGO_DEBUG="false",
            LOG_LEVEL="WARNING",
        )
        try:
            report = asyncio.run(measure(live.base_url, live.headers(), models, args))
        finally:
            stop_server(live)
    report["settings"] = {k: getattr(args, k) for k in ("streams", "tokens", "seconds", "rounds")}
    print(render(report, args))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
