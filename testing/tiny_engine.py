"""Driving an :class:`~inference.engine.Engine` from synchronous tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from inference.engine import Engine, EngineConfig
from inference.model_loader import ModelConfig
from inference.sampling import SamplingParams
from testing.tiny_model import tiny_model, tiny_tokenizer


def start_tiny_engine(**config) -> Engine:
    """An engine serving the tiny random model, started and ready."""
    tokenizer = tiny_tokenizer()
    engine = Engine(ModelConfig(path="tiny", model_id="tiny", weights="float32"), EngineConfig(**config))
    engine.start(tiny_model(len(tokenizer)), tokenizer)
    assert engine.wait_ready(30)
    return engine


@dataclass
class Result:
    """Everything one candidate produced, step by step."""

    deltas: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_tokens: int = 0

    @property
    def text(self) -> str:
        return "".join(self.deltas)


async def run(engine: Engine, prompt: str, params: SamplingParams, request_id: str = "r") -> dict[int, Result]:
    """Submit one request and collect each candidate's :class:`Result`."""
    results: dict[int, Result] = {}
    async for output in engine.submit(request_id, engine.encode(prompt), params):
        for candidate in output.outputs:
            result = results.setdefault(candidate.index, Result())
            result.deltas.append(candidate.text)
            result.token_ids.extend(candidate.token_ids)
            result.finish_reason = candidate.finish_reason
            result.num_tokens = candidate.num_tokens
    return results


def run_one(engine: Engine, prompt: str, **params) -> Result:
    return asyncio.run(run(engine, prompt, SamplingParams(**params)))[0]


def run_many(engine: Engine, requests: list[tuple[str, dict]]) -> list[Result]:
    """Submit all ``(prompt, params)`` at once, so they share batches; results in order."""

    async def main():
        return await asyncio.gather(
            *(run(engine, prompt, SamplingParams(**params), f"r{i}") for i, (prompt, params) in enumerate(requests))
        )

    return [results[0] for results in asyncio.run(main())]
