"""The API's response bodies as ``TypedDict``s, fields in the order of OpenAI's spec.

Built by the functions of ``api/protocol.py`` (``completion_response``, ``completion_chunk``, ...)
and checked against the vendored spec by ``tests/unit/test_protocol_responses.py``; the names are
the spec's schemas (``CreateCompletionResponse``, ``CompletionUsage``, ``Model``, ...).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


class CompletionUsage(TypedDict):
    """``CompletionUsage``: token counts of a request (``total_tokens`` is their sum)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(TypedDict):
    """A choice's ``logprobs``: four parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(TypedDict):
    """One choice; ``finish_reason`` is ``None`` on a stream chunk before the last."""

    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CreateCompletionResponse(TypedDict):
    """``CreateCompletionResponse``; ``created`` in Unix seconds."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage


class CompletionChunk(TypedDict):
    """One SSE event's body: the response's shape; ``usage`` only with ``include_usage`` (null but last)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: NotRequired[CompletionUsage | None]


class ModelRunnerInfo(TypedDict):
    """Our extension of ``Model``: which runner serves the model (``llama``: our own forward pass,
    ``transformers``: transformers' modeling) and why."""

    name: Literal["llama", "transformers"]
    reason: str


class Model(TypedDict):
    """``Model``; ``created`` in Unix seconds; ``runner`` our extension, once the model is loaded."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    runner: NotRequired[ModelRunnerInfo]


class ListModelsResponse(TypedDict):
    """``ListModelsResponse``."""

    object: Literal["list"]
    data: list[Model]
