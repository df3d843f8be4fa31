"""What the engine hands the asyncio side: step outputs and errors. No torch here.

The views and the serving layer import these without loading torch, so management commands
and system checks start quickly.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class EngineError(Exception):
    """The engine could not serve a request; ``status`` is the HTTP status to answer with."""

    status = 500


class ChatTemplateError(ValueError):
    """The model's chat template refused the messages (its ``raise_exception``: e.g. Gemma's
    templates for a system role, or roles that do not alternate); the message is the template's."""


class EngineNotReady(EngineError):
    """The model is still loading (or failed to load)."""

    status = 503


class EngineShuttingDown(EngineError):
    """The engine was stopped (the process is shutting down): the client should retry elsewhere."""

    status = 503


class EngineOverloaded(EngineError):
    """The waiting queue is full (``ENGINE_MAX_QUEUE``); the client should retry later."""

    status = 503


@dataclass
class TokenLogprob:
    """One token's log-probability and its ``top`` alternatives (``[(token_id, logprob)]``, best first).

    ``logprob`` is ``None`` for the first prompt token, which has nothing before it.
    """

    token_id: int
    logprob: float | None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class CompletionOutput:
    """What one candidate released in one step.

    ``token_ids`` and ``texts`` are aligned: ``texts[k]`` is the text ``token_ids[k]`` adds to the
    completion (``""`` for a token whose bytes complete in a later token; cut short for the token
    where a stop string begins).  ``text`` is ``"".join(texts)``.  ``logprobs`` is aligned too when
    asked for.  ``finish_reason`` is ``"stop"``, ``"length"`` or ``None`` while running.
    ``cumulative_logprob`` sums the sampled tokens' log-probabilities (for ``best_of``).
    """

    index: int
    text: str
    token_ids: list[int]
    texts: list[str]
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    num_tokens: int
    cumulative_logprob: float


@dataclass
class RequestOutput:
    """One step's outputs of a request: a :class:`CompletionOutput` per candidate that changed.

    ``prompt_logprobs`` comes once, in the first output, when asked for (one entry per prompt
    token, the first with ``logprob=None``).  ``finished`` is set on the last output.
    """

    request_id: str
    outputs: list[CompletionOutput]
    prompt_logprobs: list[TokenLogprob] | None = None
    finished: bool = False
