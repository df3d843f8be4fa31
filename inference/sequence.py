"""Request and sequence state: what the engine knows about a submitted request and its candidates.

A :class:`Request` is one engine request (one prompt of an API request, with ``best_of``
candidates); each candidate is a :class:`SequenceState`.  The scheduler reads a request's prompt and
prefill progress, the output processor writes a sequence's tokens and text, and the model runner
never sees either: it knows a request only by :attr:`Request.key`.  (vLLM v1 splits its state the
same way: ``vllm/v1/request.py`` against the runner's input batch.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import torch

from .outputs import RequestOutput, TokenLogprob
from .sampling import SamplingParams
from .text import IncrementalDetokenizer, StopMatcher


class Request:
    """A submitted request: its prompt, parameters, candidates, and the bridge to its event loop.

    ``group`` names the API request it belongs to (the scheduler shares prefill turns between
    groups, not between prompts); it defaults to ``request_id``.  ``prefilled`` counts the prompt
    tokens already in the model runner's cache, ``cached_tokens`` those of them reused from its
    prefix cache (:mod:`inference.prefix_cache`).  ``prompt_logprobs`` collects the prompt tokens'
    log-probabilities (the first token's is ``None``) until they are published.  ``arrival`` and
    ``first_token_at`` (``time.monotonic()`` seconds) time it for the metrics (:mod:`inference.metrics`).
    """

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop,
        device: torch.device,
        group: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.group = request_id if group is None else group
        self.arrival = time.monotonic()
        self.first_token_at: float | None = None
        self.prompt_ids = prompt_ids
        self.params = params
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.prefilled = 0
        self.cached_tokens = 0  # prompt tokens reused from the prefix cache
        self.prefix_epoch = -1  # the runner's prefix_epoch when it last looked there
        self.prompt_logprobs: list[TokenLogprob] | None = (
            [TokenLogprob(prompt_ids[0], None)] if params.prompt_logprobs else None
        )
        self.sequences: list[SequenceState] = []
        self.device = device
        self.bias_ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=device)
        self.bias_values = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32, device=device)
        self.wants_logprobs = params.logprobs is not None or params.best_of > params.n

    @property
    def key(self) -> int:
        """The request's identity for the model runner (:class:`~inference.model_runner.PrefillChunk`)."""
        return id(self)

    @property
    def rows(self) -> int:
        """Rows of the running batch the request takes once prefilled: none for a scoring request
        (``max_tokens`` 0 finishes at its prefill), else one per candidate."""
        return 0 if self.params.max_tokens == 0 else self.params.best_of

    def push(self, item: RequestOutput | BaseException) -> None:
        """Hand ``item`` to the request's event loop; never blocks the worker."""
        push_all([(self, item)])


def push_all(items: Sequence[tuple[Request, RequestOutput | BaseException]]) -> None:
    """Hand each item to its request's event loop, in order, with one ``call_soon_threadsafe`` per loop.

    Each call writes the loop's self-pipe and wakes it: one per request and step made a decode
    step of 8 streams 8 system calls and 8 wake-ups of the event loop's thread, competing with
    the worker for the CPU and the GIL (a server's requests share one loop).  Never blocks.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Request, RequestOutput | BaseException]]] = {}
    for request, item in items:
        by_loop.setdefault(request.loop, []).append((request, item))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, batch)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def _deliver(batch: list[tuple[Request, RequestOutput | BaseException]]) -> None:
    """On the requests' event loop: put each item on its request's queue."""
    for request, item in batch:
        request.queue.put_nowait(item)


class SequenceState:
    """One candidate of a request: its generated tokens, text, and sampling state."""

    def __init__(self, request: Request, index: int, detokenizer: IncrementalDetokenizer) -> None:
        self.request = request
        self.index = index
        params = request.params
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=request.device)
            if params.seed is not None:
                self.generator.manual_seed(params.seed + index)
            else:
                self.generator.seed()
        self.detokenizer = detokenizer
        self.length = len(request.prompt_ids)  # tokens in the KV cache once joined
        self.next_token = -1  # sampled, not yet in the KV cache
        self.token_ids: list[int] = []
        self.texts: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.chars = 0  # characters generated so far: the text is texts joined
        self.stop_matcher = StopMatcher(request.params.stop)
        self.cut: int | None = None  # where a stop string begins, once found
        self.released_tokens = 0
        self.released_chars = 0
        self.cumulative_logprob = 0.0
        self.counts: torch.Tensor | None = None
        self.finish_reason: str | None = None
        # structured output: this candidate's own parser state (None: unconstrained)
        self.grammar = params.grammar.matcher() if params.grammar is not None else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
