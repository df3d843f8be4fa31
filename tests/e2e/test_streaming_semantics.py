"""``stream``: the same answer as without it, cut into chunks, ending with ``data: [DONE]``.

For a greedy or seeded request the chunks put back together equal the non-streamed choices, text,
``logprobs`` and ``text_offset`` included (also with ``echo``, ``n > 1`` and stop strings); every
chunk has the same ``id``, ``created`` and ``model``; a choice's chunks carry its ``index`` and
``finish_reason`` null but on its last; no chunk splits a UTF-8 character; text that could still
become a stop string is held back, never taken back.  ``stream_options.include_usage`` puts
``usage: null`` on every chunk and the request's usage on one last chunk with no choices.
"""

from __future__ import annotations

import json

import httpx
import pytest

from testing.live_server import MODEL, start_server, stop_server
from tests.completion_helpers import NO_EOS, complete, merge_stream, stream_events

PROMPT = "The capital of France is"
NON_LATIN_PROMPT = "Reply with only emojis: 😀😃😄 and Chinese: 你好，世界。"

SAME_AS_NON_STREAMED = {
    "greedy_with_logprobs": {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 2, "logit_bias": NO_EOS},
    "seeded_n_with_echo": {
        "prompt": PROMPT,
        "max_tokens": 5,
        "temperature": 1.0,
        "seed": 3,
        "n": 3,
        "echo": True,
        "logprobs": 1,
        "logit_bias": NO_EOS,
    },
    "two_prompts_seeded": {
        "prompt": [PROMPT, "Once upon a time"],
        "max_tokens": 4,
        "temperature": 0.8,
        "seed": 8,
        "n": 2,
        "logprobs": 0,
        "logit_bias": NO_EOS,
    },
    "non_latin": {"prompt": NON_LATIN_PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 1, "logit_bias": NO_EOS},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The deterministic mode (float32): the stream and the plain answer are served in batches that
    differ in when the prompts join, where bfloat16 can move a near-tie (docs/configuration.md)."""
    live = start_server(tmp_path_factory.mktemp("stream"), MODEL_DTYPE="float32", MODEL_WEIGHTS="float32")
    yield live
    stop_server(live)


@pytest.mark.parametrize("name", list(SAME_AS_NON_STREAMED))
def test_the_stream_put_together_equals_the_non_streamed_answer(server, name):
    body = SAME_AS_NON_STREAMED[name]
    whole = complete(server, **body)
    chunks = stream_events(server, **body, stream_options={"include_usage": True})
    *chunks, usage = chunks
    assert merge_stream(chunks) == whole["choices"]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]


@pytest.fixture(scope="module")
def n_stream(server) -> list[dict]:
    return stream_events(server, prompt=PROMPT, max_tokens=4, temperature=1.0, seed=1, n=3, logit_bias=NO_EOS)


def test_every_chunk_has_the_same_id_created_model_and_object(n_stream):
    assert len({(c["id"], c["created"], c["model"], c["object"]) for c in n_stream}) == 1
    assert n_stream[0]["model"] == MODEL and n_stream[0]["object"] == "text_completion"


def test_each_choice_has_its_own_index_and_a_finish_reason_only_on_its_last_chunk(n_stream):
    seen: dict[int, list[str | None]] = {}
    for chunk in n_stream:
        (choice,) = chunk["choices"]  # one choice per chunk
        seen.setdefault(choice["index"], []).append(choice["finish_reason"])
    assert sorted(seen) == [0, 1, 2]
    for reasons in seen.values():
        assert reasons[-1] == "length" and all(reason is None for reason in reasons[:-1])


def test_without_include_usage_no_chunk_has_usage(n_stream):
    assert all("usage" not in chunk for chunk in n_stream)


def test_with_include_usage_every_chunk_has_null_usage_but_the_last_which_has_no_choices(server):
    chunks = stream_events(
        server,
        prompt=PROMPT,
        max_tokens=3,
        temperature=0,
        n=2,
        logit_bias=NO_EOS,
        stream_options={"include_usage": True},
    )
    *chunks, last = chunks
    assert all(chunk["usage"] is None and chunk["choices"] for chunk in chunks)
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 6
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 6


def test_include_usage_false_is_no_usage(server):
    chunks = stream_events(server, prompt=PROMPT, max_tokens=2, temperature=0, stream_options={"include_usage": False})
    assert all("usage" not in chunk for chunk in chunks)


def test_no_chunk_splits_a_utf8_character(server):
    """Read the raw bytes: every event is whole UTF-8 JSON and no text holds a replacement character."""
    body = {"model": MODEL, **SAME_AS_NON_STREAMED["non_latin"], "stream": True, "logprobs": None}
    with httpx.stream(
        "POST", server.api_url + "/completions", json=body, headers=server.headers(), timeout=120
    ) as response:
        raw = b"".join(response.iter_bytes())
    events = [event for event in raw.split(b"\n\n") if event]
    assert events[-1] == b"data: [DONE]"
    texts = []
    for event in events[:-1]:
        assert event.startswith(b"data: ")
        chunk = json.loads(event[len(b"data: ") :].decode("utf-8"))  # strict: raises on a split character
        (choice,) = chunk["choices"]
        texts.append(choice["text"])
    joined = "".join(texts)
    assert any(ord(char) > 0x2000 for char in joined), f"no non-Latin text was generated: {joined!r}"
    assert "\ufffd" not in joined
    assert all(text.encode("utf-8").decode("utf-8") == text for text in texts)
    assert joined == complete(server, **{**SAME_AS_NON_STREAMED["non_latin"], "logprobs": None})["choices"][0]["text"]


def test_a_stop_string_is_held_back_never_streamed_and_the_text_equals_the_non_streamed_one(server):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logit_bias": NO_EOS, "logprobs": 1}
    full = complete(server, **body)["choices"][0]["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 4]  # a stop string that may span tokens
    assert len(stop) == 4
    cut = complete(server, **body, stop=[stop, "never-appears"])
    chunks = stream_events(server, **body, stop=[stop, "never-appears"])
    released = ""
    for chunk in chunks:
        released += chunk["choices"][0]["text"]
        assert full.startswith(released)  # nothing is ever taken back
        assert stop not in released
    assert released == full[: full.index(stop)] == cut["choices"][0]["text"]
    assert merge_stream(chunks) == cut["choices"]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_done_comes_once_and_last(server):
    response = httpx.post(
        server.api_url + "/completions",
        headers=server.headers(),
        timeout=120,
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "stream": True},
    )
    lines = [line for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    assert response.text.endswith("data: [DONE]\n\n")
