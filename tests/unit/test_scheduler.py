"""The scheduler alone: which prompt chunks each prefill pass takes, with hand-made requests and no model."""

from __future__ import annotations

import torch

from inference.sampling import SamplingParams
from inference.scheduler import IDLE_PREFILL_CHUNK, LOGITS_CHUNK, LONG_CONTEXT, NEWCOMER_PASS_OTHERS, Scheduler
from inference.sequence import Request

CHUNK = 64


def request(name: str, tokens: int, group: str | None = None, **params) -> Request:
    return Request(name, list(range(1, tokens + 1)), SamplingParams(**params), None, torch.device("cpu"), group)


def step(scheduler: Scheduler, running_rows: int = 1) -> list[tuple[str, int, int]]:
    """One pass, as the engine runs it: schedule, mark the chunks prefilled, forget finished prompts."""
    chunks = scheduler.schedule(running_rows)
    for chunk in chunks:
        chunk.request.prefilled = chunk.end
    scheduler.finish_prefills()
    return [(chunk.request.request_id, chunk.start, chunk.end) for chunk in chunks]


def test_a_short_request_behind_a_big_group_is_prefilled_in_the_next_pass():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=CHUNK)
    scheduler.add([request(f"big-{i}", 200, group="big") for i in range(8)])
    assert step(scheduler) == [("big-0", 0, 64)]
    scheduler.add([request("small", 5)])
    assert step(scheduler) == [("small", 0, 5), ("big-0", 64, 123)]
    assert step(scheduler) == [("big-0", 123, 187)]


def test_groups_take_turns_whoever_waited_longest_first():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=CHUNK)
    scheduler.add([request("a", 300, group="A"), request("b", 300, group="B"), request("c", 300, group="C")])
    firsts = [step(scheduler)[0][0] for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]


def test_requests_of_one_group_keep_their_order_and_short_ones_share_a_pass():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=CHUNK)
    scheduler.add([request(f"p{i}", 10, group="g") for i in range(4)] + [request("other", 10)])
    assert step(scheduler) == [("p0", 0, 10), ("other", 0, 10), ("p1", 0, 10), ("p2", 0, 10), ("p3", 0, 10)]
    assert len(scheduler) == 0


def test_a_short_prompt_waits_for_a_pass_it_fits_in_rather_than_being_cut():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=CHUNK)
    scheduler.add([request("a", 40), request("b", 40)])
    assert step(scheduler) == [("a", 0, 40)]
    assert step(scheduler) == [("b", 0, 40)]


def test_with_nothing_running_a_pass_may_take_more_whole_prompts_but_cuts_long_ones_at_the_chunk():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=CHUNK)
    scheduler.add([request(f"p{i}", 50, group="g") for i in range(3)])
    assert step(scheduler, running_rows=0) == [("p0", 0, 50), ("p1", 0, 50), ("p2", 0, 50)]
    scheduler.add([request("whole", IDLE_PREFILL_CHUNK - 24)])
    assert step(scheduler, running_rows=0) == [("whole", 0, IDLE_PREFILL_CHUNK - 24)]
    scheduler.add([request("long", IDLE_PREFILL_CHUNK + 10)])
    assert step(scheduler, running_rows=0) == [("long", 0, CHUNK)]
    assert step(scheduler, running_rows=4) == [("long", CHUNK, 2 * CHUNK)]
    ends = []
    while len(scheduler):  # at idle, the rest goes on in chunks too, not in one pass once it fits
        ((_, start, end),) = step(scheduler, running_rows=0)
        assert end - start <= CHUNK
        ends.append(end)
    assert ends[-1] == IDLE_PREFILL_CHUNK + 10


def test_a_newcomers_pass_is_short_for_the_requests_that_had_turns():
    """Issue 12's fairness rule: a short request arriving while 64 long prompts are prefilled gets a
    pass in which the long ones take at most NEWCOMER_PASS_OTHERS tokens, not a whole chunk."""
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=256)
    scheduler.add([request(f"big-{i}", 2000, group="big", max_tokens=1) for i in range(64)])
    assert step(scheduler, running_rows=0) == [("big-0", 0, 256)]
    scheduler.add([request("small", 16)])
    assert step(scheduler, running_rows=0) == [("small", 0, 16), ("big-0", 256, 256 + NEWCOMER_PASS_OTHERS)]
    assert step(scheduler, running_rows=1) == [("big-0", 256 + NEWCOMER_PASS_OTHERS, 512 + NEWCOMER_PASS_OTHERS)]


def test_a_long_prompts_chunks_shrink_past_the_long_context_as_its_attention_grows():
    """Chunks of prefill_chunk up to LONG_CONTEXT cached positions, then prefill_chunk *
    LONG_CONTEXT / cached: a pass over a 2,000-token prompt's late chunk stays short."""
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=256)
    scheduler.add([request("long", 2000, max_tokens=1)])
    sizes = []
    while len(scheduler):
        [(_, start, end)] = step(scheduler)
        sizes.append((start, end - start))
    whole = [(start, size) for start, size in sizes if start <= LONG_CONTEXT]
    assert whole == [(start, 256) for start in range(0, LONG_CONTEXT + 1, 256)]
    assert all(size == max(16, 256 * LONG_CONTEXT // start) for start, size in sizes[len(whole) : -1])
    assert len(sizes) > len(whole) + 1 and sizes[len(whole)][1] < 256
    assert sum(size for _, size in sizes) == 2000 and sizes[-1][1] <= 256 * LONG_CONTEXT // sizes[-1][0]
    assert scheduler.continuation_chunk(100 * LONG_CONTEXT) == 16  # never fewer


def test_a_prefix_from_the_cache_does_not_shrink_a_new_requests_first_chunk():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=256)
    reused = request("reused", 3200)
    reused.prefilled = reused.cached_tokens = 3000  # the prefix cache held its first 3,000 tokens
    scheduler.add([reused])
    assert step(scheduler) == [("reused", 3000, 3200)]  # one pass, not chunks of 256 * 512 // 3000


def test_a_long_prompts_shrunk_tail_shares_a_pass_when_it_fits_its_own_limit():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=256)
    tail = request("tail", 1100)
    tail.prefilled = 1000  # its own chunks so far: the limit is 256 * 512 // 1000 = 131
    scheduler.add([request("first", 10), tail])
    assert step(scheduler) == [("first", 0, 10), ("tail", 1000, 1100)]
    assert Scheduler(max_batch_size=32, prefill_chunk=8).continuation_chunk(10_000) == 8  # never past the chunk


def test_scoring_requests_are_prefilled_several_at_a_time_within_the_logits_budget():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=CHUNK)
    scoring = {"max_tokens": 0, "logprobs": 1, "prompt_logprobs": True}
    size = 40
    scheduler.add([request(f"s{i}", size, **scoring) for i in range(20)])
    first = step(scheduler, running_rows=0)
    assert len(first) == LOGITS_CHUNK // size and all(end - start == size for _, start, end in first)


def test_no_request_joins_a_full_batch_but_scoring_requests_still_run():
    scheduler = Scheduler(max_batch_size=4, prefill_chunk=CHUNK)
    scheduler.add(
        [request("wide", 5, n=2, best_of=2), request("scoring", 5, max_tokens=0, prompt_logprobs=True, logprobs=0)]
    )
    assert step(scheduler, running_rows=3) == [("scoring", 0, 5)]
    assert step(scheduler, running_rows=2) == [("wide", 0, 5)]


def test_a_request_wider_than_the_whole_batch_runs_alone():
    scheduler = Scheduler(max_batch_size=2, prefill_chunk=CHUNK)
    scheduler.add([request("wide", 5, n=3, best_of=3), request("next", 5)])
    assert step(scheduler, running_rows=0) == [("wide", 0, 5)]
    assert step(scheduler, running_rows=3) == []


def test_aborted_requests_leave_the_queue():
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=CHUNK)
    scheduler.add([request("a", 5, group="g"), request("b", 5, group="g"), request("c", 5)])
    assert [r.request_id for r in scheduler.remove({"b", "c"})] == ["b", "c"]
    assert len(scheduler) == 1 and step(scheduler) == [("a", 0, 5)]


def test_newcomers_arriving_every_pass_do_not_starve_a_prompt_under_their_cap():
    """From a review: under a newcomer's cap a short remainder used to wait for a pass it fits in
    whole, which never came while a short request arrived every pass."""
    scheduler = Scheduler(max_batch_size=32, prefill_chunk=256)
    scheduler.add([request("old", 356)])
    assert step(scheduler) == [("old", 0, 256)]
    for i in range(3):
        scheduler.add([request(f"new{i}", 16)])
        step(scheduler)
    assert "old" not in [r.request_id for r in scheduler]
