"""One ``/v1/chat/completions`` request in flight: the chat template's prompt to an engine stream,
its outputs to the chat shapes.

:class:`ChatRun` is a :class:`api.generation.Generation` (engine stream, token counts and abort, as
for ``/v1/completions``) with the chat endpoint's protocol (:mod:`api.chat.protocol`): one prompt,
the model's chat template; ``n`` choices; ``CreateChatCompletionResponse`` or
``CreateChatCompletionStreamResponse`` chunks.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from inference.outputs import ChatTemplateError

from ..errors import APIError
from ..generation import Candidate, Generation, Prompt
from ..protocol import usage_dict
from ..response_format import compile_grammar
from .protocol import (
    NOT_A_CHAT_MODEL,
    ChatCompletionRequest,
    chat_choice,
    chat_chunk,
    chat_response,
    chunk_choice,
    token_logprob,
)

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.outputs import TokenLogprob


class ChatRun(Generation):
    """Serves one :class:`ChatCompletionRequest` with ``engine`` (see :class:`api.generation.Generation`)."""

    def __init__(self, engine: Engine, request: ChatCompletionRequest, completion_id: str) -> None:
        super().__init__(engine, completion_id, request.sampling_params())
        self.request = request

    async def prepare(self) -> None:
        """Apply the chat template, check the context, compile ``response_format``.

        Raises ``APIError``: 404 (``param: "model"``, OpenAI's words) for a model without a chat
        template; 400 ``context_length_exceeded`` (``messages``, or the token limit's name) when the
        prompt and the limit do not fit; 400 naming ``response_format`` for a schema the grammar
        library cannot compile; 400 for ``logit_bias`` keys outside the vocabulary.
        """
        engine, request = self.engine, self.request
        if not engine.has_chat_template:
            raise APIError(NOT_A_CHAT_MODEL, status=404, param="model", code="model_not_found")
        request.check_token_ids(engine.vocab_size)
        try:
            ids = await asyncio.to_thread(engine.chat_prompt_ids, request.messages)
        except ChatTemplateError as error:  # the model's template refuses the conversation (a role it lacks)
            raise APIError(f"The model's chat template refused the messages: {error}", param="messages") from error
        remainder = engine.max_context - len(ids)
        limit = request.max_completion_tokens
        if remainder < 1 or (limit is not None and limit > remainder):
            raise APIError(
                f"This model's maximum context length is {engine.max_context} tokens. However, your messages "
                f"resulted in {len(ids)} tokens"
                + (f" and you requested {limit} completion tokens." if limit else ".")
                + " Please reduce the length of the messages or completion.",
                param="messages" if remainder < 1 else "max_completion_tokens",
                code="context_length_exceeded",
            )
        grammar = await compile_grammar(engine, request.response_format)
        self.params = dataclasses.replace(request.sampling_params(max_tokens=limit or remainder), grammar=grammar)
        self.prompts = [Prompt(ids, "")]
        self.prompt_tokens = len(ids)

    @property
    def _fingerprint(self) -> str:
        return self.engine.system_fingerprint

    def _chat_logprobs(self, entries: list[TokenLogprob] | None) -> list[dict] | None:
        if not self.request.logprobs:
            return None
        return [token_logprob(self.engine.tokenizer, entry) for entry in entries or []]

    async def response(self) -> dict[str, Any]:
        """The whole ``CreateChatCompletionResponse`` once every choice has finished."""
        candidates: dict[int, Candidate] = {}
        async for _, output in self.outputs():
            for candidate in output.outputs:
                self.count(0, candidate)
                candidates.setdefault(candidate.index, Candidate()).add(candidate)
        choices = [
            chat_choice(i, candidates[i].text, candidates[i].finish_reason, self._chat_logprobs(candidates[i].logprobs))
            for i in range(self.request.n)
        ]
        usage = usage_dict(self.prompt_tokens, self.completion_tokens)
        return chat_response(self.id, self.created, self.engine.model_id, self._fingerprint, choices, usage)

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The stream: a ``delta.role`` chunk per choice first, then ``delta.content`` pieces, a last
        chunk per choice with ``finish_reason`` and an empty delta, then the usage chunk if asked."""
        include_usage = self.request.include_usage
        model, fingerprint = self.engine.model_id, self._fingerprint

        def chunk(choice: dict[str, Any]) -> dict[str, Any]:
            return chat_chunk(self.id, self.created, model, fingerprint, [choice], include_usage=include_usage)

        for index in range(self.request.n):
            yield chunk(chunk_choice(index, {"role": "assistant", "content": "", "refusal": None}))
        async for _, output in self.outputs():
            for candidate in output.outputs:
                self.count(0, candidate)
                if candidate.text or candidate.logprobs:
                    logprobs = self._chat_logprobs(candidate.logprobs)
                    yield chunk(chunk_choice(candidate.index, {"content": candidate.text}, logprobs=logprobs))
                if candidate.finish_reason is not None:
                    yield chunk(chunk_choice(candidate.index, {}, candidate.finish_reason))
        if include_usage:
            usage = usage_dict(self.prompt_tokens, self.completion_tokens)
            yield chat_chunk(self.id, self.created, model, fingerprint, [], usage=usage, include_usage=True)
