"""Stop strings: matched on decoded text across token boundaries, never shown, never taken back."""

from __future__ import annotations

import pytest

from inference.text import StopMatcher
from testing.tiny_engine import run_one, start_tiny_engine

PROMPT = "Hello, world!"


@pytest.fixture(scope="module")
def engine():
    engine = start_tiny_engine()
    yield engine
    engine.stop()


def feed_pieces(stops: list[str], pieces: list[str]) -> tuple[int, int]:
    """Feed ``pieces`` one by one; return (where the first stop begins or -1, the final holdback)."""
    matcher = StopMatcher(stops)
    for piece in pieces:
        found = matcher.feed(piece)
        if found != -1:
            return found, matcher.holdback
    return -1, matcher.holdback


@pytest.mark.parametrize(
    ("pieces", "stops", "expected"),
    [
        (["abcdef"], ["cd"], 2),
        (["ab", "cd", "ef"], ["x", "ef", "bc"], 1),
        (["a", "b", "c"], ["abcd"], -1),
        ([""], ["a"], -1),
        (["aaab", "a"], ["aaba"], 1),  # a partial match that fails must still find the later one
        (["xx", "abab", "ac"], ["ababac"], 2),
    ],
)
def test_the_first_stop_to_complete_is_found_whatever_the_piece_boundaries(pieces, stops, expected):
    assert feed_pieces(stops, pieces)[0] == expected


@pytest.mark.parametrize(
    ("text", "stops", "expected"),
    [
        ("hello wor", ["world"], 3),
        ("hello", ["world"], 0),
        ("xyab", ["abc"], 2),
        ("xa", ["ab", "a"], 0),
        ("aaa", ["aab"], 2),
    ],
)
def test_holdback_is_the_longest_tail_that_could_still_become_a_stop(text, stops, expected):
    found, holdback = feed_pieces(stops, list(text))
    assert found == -1 or expected == 0
    if found == -1:
        assert holdback == expected


def test_a_long_stop_string_costs_linear_time():
    matcher = StopMatcher(["a" * 100_000 + "b"])
    assert matcher.feed("a" * 200_000) == -1
    assert matcher.holdback == 100_000
    assert matcher.feed("b") == 100_000


def test_text_with_a_stop_equals_the_text_without_it_cut_before_the_stop(engine):
    full = run_one(engine, PROMPT, max_tokens=40, temperature=0, ignore_eos=True).text
    for start, size in [(5, 1), (10, 3), (17, 2), (0, 2)]:
        stop = full[start : start + size]
        result = run_one(engine, PROMPT, max_tokens=40, temperature=0, ignore_eos=True, stop=(stop,))
        assert result.text == full[: full.index(stop)]
        assert result.finish_reason == "stop"


def test_no_streamed_delta_ever_contains_a_stop_string_or_has_to_be_taken_back(engine):
    full = run_one(engine, PROMPT, max_tokens=40, temperature=0, ignore_eos=True).text
    stop = full[20:24]
    result = run_one(engine, PROMPT, max_tokens=40, temperature=0, ignore_eos=True, stop=(stop,))
    released = ""
    for delta in result.deltas:
        released += delta
        assert full.startswith(released)  # nothing is ever taken back
        assert stop not in released
    assert released == full[: full.index(stop)]


def test_a_stop_string_that_is_never_completed_is_released_at_the_end(engine):
    full = run_one(engine, PROMPT, max_tokens=30, temperature=0, ignore_eos=True).text
    never = full[-2:] + "~never~"
    result = run_one(engine, PROMPT, max_tokens=30, temperature=0, ignore_eos=True, stop=(never,))
    assert result.text == full
    assert result.finish_reason == "length"


def test_the_earliest_of_several_stops_wins(engine):
    full = run_one(engine, PROMPT, max_tokens=40, temperature=0, ignore_eos=True).text
    early, late = full[8:10], full[25:28]
    result = run_one(engine, PROMPT, max_tokens=40, temperature=0, ignore_eos=True, stop=(late, early))
    assert result.text == full[: min(full.index(early), full.index(late))]
