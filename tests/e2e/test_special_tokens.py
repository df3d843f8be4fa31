"""Special tokens are text: in an echoed prompt and in what the model writes.

So ``logprobs.tokens`` spell the text, ``text_offset`` points at them, and a stop string such as
``"<|im_start|>"`` matches.  (The end-of-sequence token is the exception: it ends a choice and is
not returned.)  The prompt is a chat turn, after which this instruct model opens the next turn.
"""

from __future__ import annotations

import pytest

from tests.completion_helpers import NO_EOS, complete, merge_stream, stream_events

CHAT_PROMPT = "<|im_start|>user\nHi<|im_end|>\n"
OPEN_TURN = "<|im_start|>"
GREEDY = {"prompt": CHAT_PROMPT, "max_tokens": 3, "temperature": 0, "logit_bias": NO_EOS}


@pytest.fixture(scope="module")
def written(server) -> dict:
    return complete(server, **GREEDY, logprobs=0)["choices"][0]


def test_a_special_token_the_model_writes_is_in_the_text(written):
    assert OPEN_TURN in written["logprobs"]["tokens"]
    assert OPEN_TURN in written["text"]
    assert "".join(written["logprobs"]["tokens"]) == written["text"]


def test_its_text_offset_points_at_it(written):
    offsets = written["logprobs"]["text_offset"]
    k = written["logprobs"]["tokens"].index(OPEN_TURN)
    start = offsets[k] - len(CHAT_PROMPT)
    assert written["text"][start : start + len(OPEN_TURN)] == OPEN_TURN


def test_a_stop_string_can_be_a_special_token(server, written):
    cut = complete(server, **GREEDY, stop=[OPEN_TURN])["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == written["text"][: written["text"].index(OPEN_TURN)]
    streamed = merge_stream(stream_events(server, **GREEDY, stop=[OPEN_TURN]))
    assert streamed == [{**cut, "index": 0}]
