"""One /v1/completions request in flight: prompts to engine streams, engine outputs to responses.

The view parses and authenticates; :class:`CompletionRun` does the rest of the API's semantics
(OpenAI's legacy Completions API, ``CreateCompletionRequest``/``CreateCompletionResponse``):
tokenising the prompts, the context-length check, choice indices ``prompt_index * n + j``,
``best_of`` ranking, ``echo``, ``logprobs`` with ``text_offset``.  One engine request per prompt,
their merged outputs and the token counts that usage accounting reads are :mod:`api.generation`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from inference.outputs import TokenLogprob
from inference.text import prompt_text_offsets, token_text

from ..errors import APIError
from ..generation import Candidate, Generation, Prompt
from ..protocol import usage_dict
from ..response_format import compile_grammar
from ..types import CompletionChoice, CompletionChunk, CompletionLogprobs, CreateCompletionResponse
from .protocol import (
    CompletionRequest,
    completion_choice,
    completion_chunk,
    completion_response,
    logprobs_dict,
)

if TYPE_CHECKING:
    from inference.engine import Engine

INLINE_ENCODE_CHARS = 2000  # prompts up to this many characters are tokenised on the event loop


class CompletionRun(Generation):
    """Serves one validated :class:`CompletionRequest` with ``engine`` (see :class:`api.generation.Generation`).

    :meth:`prepare` tokenises the prompts and raises ``APIError`` 400 for bad token ids, a missing
    fill-in-the-middle vocabulary or an overflowing context; :meth:`response` and :meth:`chunks`
    give the legacy shapes, choice ``prompt_index * n + j``, ``best_of`` ranked.
    """

    def __init__(self, engine: Engine, request: CompletionRequest, completion_id: str) -> None:
        params = request.sampling_params()
        if params.best_of > params.n and params.logprobs is None:
            # best_of ranks candidates by the mean log-probability of the tokens they return, so
            # the engine must hand those back even when the client did not ask for logprobs.
            params = dataclasses.replace(params, logprobs=0)
        super().__init__(engine, completion_id, params)
        self.request = request

    async def prepare(self) -> None:
        """Tokenise every prompt (in a thread: a long prompt must not stall the event loop)."""
        engine, request = self.engine, self.request
        request.check_token_ids(engine.vocab_size)
        for prompt in request.prompts:
            if request.suffix:
                ids, text = self._fim_prompt(prompt, request.suffix), ""
            elif isinstance(prompt, str):
                ids = await self._encode(prompt) if prompt else []
                text = prompt
            else:
                # Echo gives back what was sent: special tokens included, as they are in a text prompt.
                ids = list(prompt)
                text = engine.tokenizer.decode(prompt, skip_special_tokens=False)
            if not ids:
                ids = engine.document_start_ids()
            request.check_context_length(len(ids), engine.max_context)
            self.prompts.append(Prompt(ids, text))
        self.prompt_tokens = sum(len(p.ids) for p in self.prompts)
        grammar = await compile_grammar(engine, request.response_format)
        if grammar is not None:
            self.params = dataclasses.replace(self.params, grammar=grammar)

    async def _encode(self, prompt: str) -> list[int]:
        """``prompt``'s ids: a short prompt on the event loop (faster than a hop to a worker thread and
        back: docs/performance.md#the-engines-worker-thread), a long one in a thread so that it cannot
        stall the loop."""
        if len(prompt) <= INLINE_ENCODE_CHARS:
            return self.engine.encode(prompt)
        return await asyncio.to_thread(self.engine.encode, prompt)

    def _fim_prompt(self, prompt: str | list[int], suffix: str) -> list[int]:
        """The fill-in-the-middle prompt for ``prompt`` and ``suffix``; the completion is the middle.

        Raises ``APIError`` 400 (``param: "suffix"``, code ``unsupported_parameter``, OpenAI's
        "Unsupported parameter: ..." for a parameter a model cannot take) when the model's tokenizer
        has no FIM tokens.
        """
        engine = self.engine
        prefix = prompt if isinstance(prompt, str) else engine.decode(prompt)
        ids = engine.fim_prompt_ids(prefix, suffix)
        if ids is None:
            raise APIError(
                f"Unsupported parameter: 'suffix' is not supported with {engine.model_id}: its tokenizer has no "
                "fill-in-the-middle tokens (<fim_prefix>, <fim_suffix>, <fim_middle>), so it cannot complete "
                "text before a suffix.",
                param="suffix",
                code="unsupported_parameter",
            )
        return ids

    async def response(self) -> CreateCompletionResponse:
        """The whole ``CreateCompletionResponse`` once every choice has finished."""
        candidates: dict[tuple[int, int], Candidate] = {}
        prompt_logprobs: dict[int, list[TokenLogprob]] = {}
        async for prompt_index, output in self.outputs():
            if output.prompt_logprobs is not None:
                prompt_logprobs[prompt_index] = output.prompt_logprobs
            for candidate in output.outputs:
                self.count(prompt_index, candidate)
                candidates.setdefault((prompt_index, candidate.index), Candidate()).add(candidate)
        choices: list[CompletionChoice] = []
        n = self.request.n
        for prompt_index, prompt in enumerate(self.prompts):
            ranked = [candidates[(prompt_index, i)] for i in range(self.params.best_of)]
            if self.params.best_of > n:
                # OpenAI: "the one with the highest log probability per token".
                ranked = sorted(ranked, key=lambda c: c.mean_logprob, reverse=True)[:n]
            for j, choice in enumerate(ranked):
                choices.append(self._choice(prompt_index * n + j, prompt, choice, prompt_logprobs.get(prompt_index)))
        return completion_response(
            self.id, self.created, self.engine.model_id, choices, usage_dict(self.prompt_tokens, self.completion_tokens)
        )

    def _choice(
        self, index: int, prompt: Prompt, choice: Candidate, prompt_logprobs: list[TokenLogprob] | None
    ) -> CompletionChoice:
        text = (prompt.text if self.request.echo else "") + choice.text
        logprobs = None
        if self.request.logprobs is not None:
            plp = prompt_logprobs if self.request.echo else None
            logprobs = self._logprobs(choice.texts, choice.logprobs, plp, prompt)
        return completion_choice(index, text, choice.finish_reason, logprobs)

    def _logprobs(
        self,
        texts: list[str],
        entries: list[TokenLogprob],
        prompt_logprobs: list[TokenLogprob] | None,
        prompt: Prompt,
        offset: int | None = None,
    ) -> CompletionLogprobs:
        """``logprobs`` for ``entries`` (whose texts are ``texts``), preceded by ``prompt_logprobs`` if given.

        OpenAI counts ``text_offset`` from the start of the prompt, so the echoed prompt's tokens
        start at 0 and the completion's at the prompt's length (or at ``offset``, where a stream
        has got to).
        """
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        text_offset: list[int] = []
        if prompt_logprobs is not None:
            for entry in prompt_logprobs:
                self._append_logprob(entry, tokens, token_logprobs, top_logprobs)
            text_offset.extend(prompt_text_offsets(self.engine.tokenizer, prompt.ids, prompt.text))
        offset = len(prompt.text) if offset is None else offset
        for entry, text in zip(entries, texts):
            self._append_logprob(entry, tokens, token_logprobs, top_logprobs)
            text_offset.append(offset)
            offset += len(text)
        return logprobs_dict(tokens, token_logprobs, top_logprobs, text_offset)

    def _append_logprob(self, entry: TokenLogprob, tokens: list, token_logprobs: list, top_logprobs: list) -> None:
        tokenizer = self.engine.tokenizer
        tokens.append(token_text(tokenizer, entry.token_id))
        token_logprobs.append(entry.logprob)
        if entry.logprob is None:
            top_logprobs.append(None)
            return
        top = {token_text(tokenizer, token_id): value for token_id, value in entry.top}
        # OpenAI: up to logprobs + 1 entries, always including the sampled token.
        top.setdefault(token_text(tokenizer, entry.token_id), entry.logprob)
        top_logprobs.append(top)

    async def chunks(self) -> AsyncIterator[CompletionChunk]:
        """The stream's chunks: one per candidate per step, then the usage chunk when asked."""
        n = self.request.n
        include_usage = self.request.include_usage
        offsets: dict[tuple[int, int], int] = {}
        # The engine sends a prompt's logprobs once; every choice of that prompt echoes them.
        prompt_logprobs: dict[int, list[TokenLogprob]] = {}
        model = self.engine.model_id
        async for prompt_index, output in self.outputs():
            prompt = self.prompts[prompt_index]
            if output.prompt_logprobs is not None:
                prompt_logprobs[prompt_index] = output.prompt_logprobs
            for candidate in output.outputs:
                self.count(prompt_index, candidate)
                key = (prompt_index, candidate.index)
                text = candidate.text
                logprobs = None
                first = key not in offsets
                if first:
                    offsets[key] = len(prompt.text)
                    if self.request.echo:
                        text = prompt.text + text
                if self.request.logprobs is not None:
                    plp = prompt_logprobs.get(prompt_index) if first and self.request.echo else None
                    logprobs = self._logprobs(candidate.texts, candidate.logprobs or [], plp, prompt, offsets[key])
                offsets[key] += len(candidate.text)
                choice = completion_choice(prompt_index * n + candidate.index, text, candidate.finish_reason, logprobs)
                yield completion_chunk(self.id, self.created, model, [choice], include_usage=include_usage)
        if include_usage:
            yield completion_chunk(
                self.id,
                self.created,
                model,
                [],
                usage=usage_dict(self.prompt_tokens, self.completion_tokens),
                include_usage=True,
            )
