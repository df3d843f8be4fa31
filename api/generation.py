"""What every generation request does in flight, whichever endpoint serves it.

A :class:`Generation` holds one request's engine streams (one per prompt, submitted as one group),
merges their outputs as they come, counts the tokens each candidate generated and the reasons it
finished (what usage accounting and the limits read, also when the run is cut short), and aborts
them all.  Each endpoint subclasses it with its protocol: :class:`api.completions.serving.CompletionRun`
(prompts, ``echo``, ``best_of``, the legacy shapes) and :class:`api.chat.serving.ChatRun` (the chat
template, the chat shapes).
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference.outputs import CompletionOutput, EngineError, EngineOverloaded, EngineShuttingDown, RequestOutput

from . import metrics
from .errors import APIError

if TYPE_CHECKING:
    from inference.engine import Engine, RequestStream
    from inference.outputs import TokenLogprob
    from inference.sampling import SamplingParams


@dataclass
class Prompt:
    """A tokenised prompt: its ids and the text that ``echo`` returns (``""`` for a chat prompt)."""

    ids: list[int]
    text: str


@dataclass
class Candidate:
    """A candidate's accumulated output (non-streamed responses and ``best_of`` ranking)."""

    text: str = ""
    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    num_tokens: int = 0
    cumulative_logprob: float = 0.0

    def add(self, output: CompletionOutput) -> None:
        self.text += output.text
        self.texts.extend(output.texts)
        self.logprobs.extend(output.logprobs or [])
        self.finish_reason = output.finish_reason
        self.num_tokens = output.num_tokens
        self.cumulative_logprob = output.cumulative_logprob

    @property
    def mean_logprob(self) -> float:
        """The mean log-probability of the tokens returned, what a client can check with ``logprobs``.

        A candidate that returned no token (it ended at once) is scored by the engine's cumulative
        log-probability, which is then that of the end-of-sequence token.
        """
        returned = [entry.logprob for entry in self.logprobs if entry.logprob is not None]
        if not returned:
            return self.cumulative_logprob
        return sum(returned) / len(returned)


class Generation(abc.ABC):
    """One generation request served with ``engine``, identified by ``completion_id``.

    Call :meth:`prepare` (the endpoint's tokenising and checks; fills ``prompts``, ``prompt_tokens``
    and the final ``params``; raises ``APIError`` 4xx), then :meth:`start` (submits; raises
    ``APIError`` 503 when the engine is loading, draining or its queue is full), then either
    :meth:`response` (the whole body) or :meth:`chunks` (the stream's bodies).  :meth:`abort` stops
    the generation; ``prompt_tokens``, ``completion_tokens``, ``finish_reasons`` and
    ``first_token_at`` are readable at any time for accounting.
    """

    def __init__(self, engine: Engine, completion_id: str, params: SamplingParams) -> None:
        self.engine = engine
        self.id = completion_id
        self.created = int(time.time())
        self.params = params
        self.prompts: list[Prompt] = []
        self.streams: list[RequestStream] = []
        self.prompt_tokens = 0
        self._tokens: dict[tuple[int, int], int] = {}  # (prompt, candidate) -> tokens generated
        self._finish: dict[tuple[int, int], str] = {}
        self.first_token_at: float | None = None

    @abc.abstractmethod
    async def prepare(self) -> None:
        """Tokenise and check the request against the model; set ``prompts`` and ``params``."""

    @abc.abstractmethod
    async def response(self) -> Mapping[str, object]:
        """The whole response body once every choice has finished."""

    @abc.abstractmethod
    def chunks(self) -> AsyncIterator[Mapping[str, object]]:
        """The stream's chunk bodies, the usage chunk last when asked."""

    @property
    def completion_tokens(self) -> int:
        return sum(self._tokens.values())

    @property
    def finish_reasons(self) -> str:
        """The distinct finish reasons so far, comma-separated (``"stop,length"``)."""
        return ",".join(sorted(set(self._finish.values())))

    def start(self) -> None:
        """Submit one engine request per prompt, all in one group (they take prefill turns with
        other API requests as one)."""
        try:
            prompts = [(f"{self.id}-{index}", prompt.ids) for index, prompt in enumerate(self.prompts)]
            self.streams.extend(self.engine.submit_many(prompts, self.params, group=self.id))
        except EngineError as error:
            self.abort()
            if isinstance(error, EngineShuttingDown):
                metrics.draining_refused.inc()  # a deploy's refusal, not a fault
            raise APIError(
                str(error),
                status=error.status,
                type="server_error",
                code=engine_error_code(error),
                headers={"Retry-After": "1"},
            ) from error

    def abort(self) -> None:
        """Stop every prompt's generation; harmless when finished."""
        for stream in self.streams:
            stream.abort()

    def count(self, prompt_index: int, output: CompletionOutput) -> None:
        """Note a candidate's progress: its tokens so far, its finish reason, the first token's time."""
        if self.first_token_at is None and output.num_tokens:
            self.first_token_at = time.monotonic()
        self._tokens[(prompt_index, output.index)] = output.num_tokens
        if output.finish_reason is not None:
            self._finish[(prompt_index, output.index)] = output.finish_reason

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Every prompt's outputs as they come, tagged with the prompt's index."""
        if len(self.streams) == 1:
            async for output in self.streams[0]:
                yield 0, output
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            try:
                async for output in stream:
                    queue.put_nowait((index, output))
            except BaseException as error:  # noqa: BLE001 - handed to the consumer below
                queue.put_nowait((index, error))
            finally:
                queue.put_nowait((index, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            remaining = len(tasks)
            while remaining:
                index, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()


def engine_error_code(error: BaseException) -> str | None:
    """The ``code`` of an engine's refusal or end of a request: a full queue, or a process shutting
    down (a refused submission's 503, or a request its grace period ended); None for other errors."""
    if isinstance(error, EngineShuttingDown):
        return "server_shutting_down"  # the same code as the draining process's own 503
    if isinstance(error, EngineOverloaded):
        return "server_overloaded"
    return None
