"""What the engine hands a model runner for a prefill pass (a leaf module: every runner imports it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens of one waiting request for one prefill call (the scheduler's choice)."""

    key: int  # the engine request's identity (id() of its state); the runner keeps its partial cache under it
    token_ids: list[int]  # this chunk's prompt tokens
    start: int  # position of token_ids[0] (tokens before it are in the runner's cache for `key`)
    all_logits: bool  # True: logits for every position (prompt logprobs); False: last position only
