"""The ModelRunner seam: what the engine asks of a forward pass and its KV caches.

A runner owns the weights, the KV cache of the running batch and of requests being prefilled,
and the forward pass; it knows nothing of sampling, text or scheduling (vLLM's model-runner seam,
``vllm/v1/worker/gpu_model_runner.py``).  The running batch is rows 0..B-1 in the engine's order.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class PrefillChunk:
    key: int                 # the engine request's identity (id() of its state); the runner keeps its partial cache under it
    token_ids: list[int]     # this chunk's prompt tokens
    start: int               # position of token_ids[0] (tokens before it are in the runner's cache for `key`)
    all_logits: bool         # True: logits for every position (prompt logprobs); False: last position only


class ModelRunner(Protocol):
    vocab_size: int          # rows of the output layer
    max_context: int         # max_position_embeddings
    description: str         # e.g. "llama runner, weights int8 (batch<=8) / float32, activations bfloat16"
    def prefill(self, chunks: Sequence[PrefillChunk]) -> list[torch.Tensor]:
        """One forward pass over chunks of one or several waiting requests (several: short prompts, or
        prompt-logprob requests, batched together). Returns per chunk float32 logits
        [len(token_ids), vocab] if all_logits else [1, vocab]."""
    def join(self, key: int, copies: int) -> None:
        """Append `copies` rows to the running batch, each holding the (fully prefilled) cache of `key`
        (n/best_of candidates share one prefill); the runner forgets `key`."""
    def decode(self, input_ids: Sequence[int]) -> torch.Tensor:
        """One decode step for every running row (input_ids[b] is row b's next token, at that row's next
        position, which the runner tracks). Returns float32 logits [B, vocab]."""
    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these running rows, in this order (finished/aborted rows leave)."""
    def release(self, key: int) -> None:
        """Forget a waiting request's partial cache (abort, failure). Harmless if unknown."""
    def reset(self) -> None:
        """Drop every cache (after a failed step)."""
    def warm_up(self) -> None:
        """Run representative prefill and decode shapes once, so the first request is as fast as the
        hundredth (kernels, allocator, autotune); called before the engine reports ready."""
