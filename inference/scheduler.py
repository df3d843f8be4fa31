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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .sequence import Request

# With nothing running, a prefill pass holds up no stream, so it may take more whole prompts
# (fewer, larger matrix products); not so many that a request arriving meanwhile waits long.
IDLE_PREFILL_CHUNK = 1024
# In a pass that prefills a newly arrived prompt whole, the requests that had turns before take at
# most this many tokens, so the newcomer's first token waits for a short pass, not a full one.
NEWCOMER_PASS_OTHERS = 64
# Prompt tokens per pass whose logits at every position are kept (prompt logprobs): float32
# logits of 512 positions over SmolLM2's 49152-token vocabulary take 100 MB.
LOGITS_CHUNK = 512
# A chunk's attention grows with the positions cached before it, its products do not: past this many,
# a prompt's own chunks shrink in proportion (prefill_chunk * LONG_CONTEXT / cached, at least 16), so
# that a pass over a long prompt's late chunk takes about as long as one at LONG_CONTEXT positions
# (up to 8,192 positions with 256-token chunks, where the floor of 16 takes over), and a short request
# behind it waits no longer (docs/performance.md#prefill-fairness).
LONG_CONTEXT = 512


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


@dataclass
class _Group:
    """The waiting requests of one API request, in order, and when the group last had a turn."""

    order: int  # arrival of the group, breaking ties
    requests: collections.deque[Request] = field(default_factory=collections.deque)
    last_turn: int = -1  # the pass that last took a chunk of it; -1: never


class Scheduler:
    """The waiting requests and the choice of each step's prefill chunks.

    Requests are grouped by ``Request.group`` (the API request: a request of 64 prompts is one
    group), and prefill chunks go round-robin over the groups: each pass serves first the groups
    that waited longest since their last turn (new ones before all), one request of each per
    round, until the pass's token budget is spent.  So a short request that arrives behind a
    big one is prefilled in the next pass, not after all of the big one's prompts (the fairness
    rule of docs/performance.md#prefill-fairness; vLLM's FCFS scheduler would serve the big one first).  Within a group,
    requests keep their order.

    A pass takes at most ``prefill_chunk`` prompt tokens while sequences run (bounding how long
    they wait), :data:`IDLE_PREFILL_CHUNK` when none runs; of them at most
    ``max(prefill_chunk, LOGITS_CHUNK)`` with logits at every position (``prompt_logprobs``), so
    scoring requests are prefilled several at a time.  A prompt longer than what is left is cut
    into chunks of at most ``prefill_chunk`` tokens (its last one too), at idle too, so that no pass
    is long for a request arriving meanwhile, and fewer once more than :data:`LONG_CONTEXT` of its
    positions are cached by its own chunks (:meth:`continuation_chunk`; a prefix reused from the
    prefix cache does not shrink a new request's first chunk); a short one (``prefill_chunk`` tokens or less) waits for the next
    pass instead.  A pass that prefills a newly arrived prompt whole gives the requests that had
    turns before at most :data:`NEWCOMER_PASS_OTHERS` tokens: a short request's first token then
    waits for the pass in progress and a short one, not two full passes.
    A request is scheduled only when its candidates will fit in the running batch
    (``max_batch_size`` rows; a request larger than the whole batch still runs, alone);
    scoring requests (``max_tokens`` 0) take no row.

    ``len()`` may be read from any thread; everything else is for the engine's worker thread.
    """

    def __init__(self, max_batch_size: int, prefill_chunk: int) -> None:
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk
        self._groups: dict[str, _Group] = {}
        self._arrivals = 0
        self._passes = 0
        self._count = 0  # waiting requests, kept as an int so other threads read it safely

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Request]:
        for group in self._groups.values():
            yield from group.requests

    def add(self, requests: Iterable[Request]) -> None:
        """Queue newly submitted requests, each behind the waiting ones of its group."""
        for request in requests:
            group = self._groups.get(request.group)
            if group is None:
                group = self._groups[request.group] = _Group(self._arrivals)
                self._arrivals += 1
            group.requests.append(request)
        self._recount()

    def remove(self, request_ids: set[str]) -> list[Request]:
        """Drop the waiting requests with these ids (aborted); returns them."""
        removed = [r for r in self if r.request_id in request_ids]
        if removed:
            self._filter(lambda r: r.request_id not in request_ids)
        return removed

    def clear(self) -> list[Request]:
        """Drop every waiting request (after a failure); returns them."""
        requests = list(self)
        self._groups.clear()
        self._recount()
        return requests

    def finish_prefills(self) -> None:
        """Forget the requests whose prompt is wholly prefilled (they have joined the batch).

        Called after the prefill call succeeds, so that a failure in it still finds every
        request of the pass here.
        """
        self._filter(lambda r: r.prefilled < len(r.prompt_ids))

    def _filter(self, keep) -> None:
        for name, group in list(self._groups.items()):
            group.requests = collections.deque(r for r in group.requests if keep(r))
            if not group.requests:
                del self._groups[name]
        self._recount()

    def _recount(self) -> None:
        self._count = sum(len(group.requests) for group in self._groups.values())

    def schedule(self, running_rows: int) -> list[ScheduledChunk]:
        """This step's prefill chunks, given ``running_rows`` rows in the running batch (see the
        class docstring); empty when no waiting request may run now."""
        budget = self.prefill_chunk if running_rows else max(self.prefill_chunk, IDLE_PREFILL_CHUNK)
        logits_budget = min(budget, max(self.prefill_chunk, LOGITS_CHUNK))
        rows = running_rows
        chunks: list[ScheduledChunk] = []
        turns = sorted(self._groups.values(), key=lambda g: (g.last_turn, g.order))
        newcomers = {id(group) for group in turns if group.last_turn < 0}
        others_room = budget  # tokens left for the groups that had turns before this pass
        next_index = {id(group): 0 for group in turns}
        done: set[int] = set()  # groups with nothing more for this pass
        while budget and len(done) < len(turns):
            for group in turns:
                if id(group) in done:
                    continue
                index = next_index[id(group)]
                if index == len(group.requests):
                    done.add(id(group))
                    continue
                request = group.requests[index]
                newcomer = id(group) in newcomers
                room = budget if newcomer else min(budget, others_room)
                size = self._chunk_size(request, room, logits_budget, bool(chunks), capped=room < budget)
                if not size or not (request.rows == 0 or not rows or rows + request.rows <= self.max_batch_size):
                    done.add(id(group))  # the group's next request waits; the ones behind it too
                    continue
                chunk = ScheduledChunk(request, request.prefilled, request.prefilled + size)
                chunks.append(chunk)
                budget -= size
                if not newcomer:
                    others_room -= size
                elif chunk.final and others_room > NEWCOMER_PASS_OTHERS:
                    others_room = NEWCOMER_PASS_OTHERS
                if request.prompt_logprobs is not None:
                    logits_budget -= size
                group.last_turn = self._passes
                if chunk.final:
                    rows += request.rows
                    next_index[id(group)] = index + 1
                else:
                    done.add(id(group))  # its prompt goes on in a later pass
                if not budget:
                    break
        self._passes += 1
        return chunks

    def continuation_chunk(self, cached: int) -> int:
        """The most prompt tokens a chunk of a prompt takes with ``cached`` of its positions
        prefilled: ``prefill_chunk`` up to :data:`LONG_CONTEXT` positions, then ``prefill_chunk *
        LONG_CONTEXT / cached`` (at least 16, at most ``prefill_chunk``), the chunk's attention
        growing with ``cached``."""
        if cached <= LONG_CONTEXT:
            return self.prefill_chunk
        return min(self.prefill_chunk, max(16, self.prefill_chunk * LONG_CONTEXT // cached))

    def _chunk_size(self, request: Request, room: int, logits_budget: int, others: bool, capped: bool = False) -> int:
        """How many of ``request``'s remaining prompt tokens this pass takes (0: none), with ``room``
        tokens left for it; ``capped``: ``room`` is a newcomer pass's cap (:data:`NEWCOMER_PASS_OTHERS`),
        under which a short prompt is cut rather than kept waiting (a short request arriving every
        pass would keep it waiting for ever)."""
        remaining = len(request.prompt_ids) - request.prefilled
        # Once its own chunks have begun (not a prefix reused from the cache), a prompt's chunks
        # shrink as its cache grows (continuation_chunk).
        limit = self.prefill_chunk
        if request.prefilled > request.cached_tokens:
            limit = self.continuation_chunk(request.prefilled)
        if request.prompt_logprobs is not None:
            room = min(room, logits_budget)
        if request.prefilled:  # a prompt being cut goes on in chunks of at most limit, its last one too
            room = min(room, limit)
        if remaining <= room:
            return remaining
        if remaining <= limit and others and not capped:
            return 0  # a short prompt waits for a pass it fits in whole, rather than being cut
        return min(room, limit)
