"""The scheduler: which waiting requests' prompt tokens the next prefill pass runs.

Continuous batching (iteration-level scheduling, Yu et al. 2022, "Orca"): every step of the
engine runs at most one prefill call, then one decode step for every running sequence.  The
scheduler keeps the waiting requests and, each step, picks the prompt chunks of that call
within the step's limits (a token budget, so running streams are not held up long, and the
batch's rows); vLLM v1's ``vllm/v1/core/sched/scheduler.py`` makes the same decision with its
token budget.  It runs no model: it sees prompts, their progress (``Request.prefilled``) and
how many rows are running.
"""
from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass

from .sequence import Request

# With nothing running, a prefill pass holds up no stream, so it may be longer.
IDLE_PREFILL_CHUNK = 2048


@dataclass(frozen=True)
class ScheduledChunk:
    """Prompt tokens ``[start, end)`` of ``request`` for this step's prefill."""

    request: Request
    start: int
    end: int

    @property
    def final(self) -> bool:
        """Whether this chunk completes the prompt (the request then joins the running batch)."""
        return self.end == len(self.request.prompt_ids)


class Scheduler:
    """The waiting requests, in order of arrival, and the choice of each step's prefill chunks.

    ``max_batch_size``: rows the running batch may hold (a request larger than the whole batch
    still runs, alone).  ``prefill_chunk``: prompt tokens per prefill pass while sequences run.
    Used by the engine's worker thread only; ``len()`` may be read from any thread.
    """

    def __init__(self, max_batch_size: int, prefill_chunk: int) -> None:
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk
        self._waiting: collections.deque[Request] = collections.deque()
        self._count = 0  # len(self._waiting), kept as an int so other threads read it safely

    def __len__(self) -> int:
        return self._count

    def add(self, requests: Iterable[Request]) -> None:
        """Queue newly submitted requests."""
        self._waiting.extend(requests)
        self._count = len(self._waiting)

    def remove(self, request_ids: set[str]) -> list[Request]:
        """Drop the waiting requests with these ids (aborted); returns them."""
        removed = [r for r in self._waiting if r.request_id in request_ids]
        if removed:
            self._waiting = collections.deque(r for r in self._waiting if r.request_id not in request_ids)
            self._count = len(self._waiting)
        return removed

    def clear(self) -> list[Request]:
        """Drop every waiting request (after a failure); returns them."""
        requests, self._waiting = list(self._waiting), collections.deque()
        self._count = 0
        return requests

    def finish_prefills(self) -> None:
        """Forget the requests whose prompt is wholly prefilled (they have joined the batch).

        Called after the prefill call succeeds, so that a failure in it still finds every
        request of the pass here.
        """
        self._waiting = collections.deque(r for r in self._waiting if r.prefilled < len(r.prompt_ids))
        self._count = len(self._waiting)

    def _has_room(self, request: Request, rows: int) -> bool:
        return not rows or rows + request.params.best_of <= self.max_batch_size

    def schedule(self, running_rows: int) -> list[ScheduledChunk]:
        """This step's prefill chunks (none when the head of the queue has no room in the batch).

        A chunk of one long prompt (or of one request with ``prompt_logprobs``), or several short
        prompts at the head of the queue together (at most ``prefill_chunk`` tokens), so a burst
        of new requests costs about one step instead of one step each.
        """
        if not self._waiting or not self._has_room(self._waiting[0], running_rows):
            return []
        head = self._waiting[0]
        if head.prefilled or head.prompt_logprobs is not None or len(head.prompt_ids) > self.prefill_chunk:
            # Chunks bound how long running streams wait for a prefill; with none running, one pass
            # (up to IDLE_PREFILL_CHUNK tokens) gives the shortest time to first token.
            # (Not with prompt_logprobs, whose logits for every position would make it a big pass.)
            busy = running_rows or head.prompt_logprobs is not None
            chunk = self.prefill_chunk if busy else max(self.prefill_chunk, IDLE_PREFILL_CHUNK)
            return [ScheduledChunk(head, head.prefilled, min(len(head.prompt_ids), head.prefilled + chunk))]
        chunks: list[ScheduledChunk] = []
        tokens = 0
        rows = running_rows
        for request in self._waiting:
            size = len(request.prompt_ids)
            if request.prompt_logprobs is not None or tokens + size > self.prefill_chunk:
                break
            if chunks and rows + request.params.best_of > self.max_batch_size:
                break
            chunks.append(ScheduledChunk(request, 0, size))
            tokens += size
            rows += request.params.best_of
        return chunks
