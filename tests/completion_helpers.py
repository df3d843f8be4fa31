"""Calling ``/v1/completions`` on the live server and reading answers back, for the invariant tests.

``complete`` asks for a JSON answer, ``stream_events`` for a stream's chunks, and ``merge_stream``
folds a stream back into per-choice text and ``logprobs`` so that it can be compared with the
non-streamed answer.  ``NO_EOS`` bans the embedded model's end-of-sequence token (``<|im_end|>``,
id 2), so a request generates exactly ``max_tokens`` tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from testing.live_server import MODEL
from testing.sse_client import stream

NO_EOS = {"2": -100}
BYTES_TOKEN = re.compile(r"^bytes:(\\x[0-9a-f]{2})+$")


def complete(server, **fields: Any) -> dict[str, Any]:
    """POST ``{"model": MODEL, **fields}``; asserts a 200 and returns the JSON body."""
    response = server.post({"model": MODEL, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def stream_events(server, **fields: Any) -> list[dict[str, Any]]:
    """Stream ``{"model": MODEL, **fields}``; asserts a 200 ending in ``[DONE]`` and returns the chunks."""
    response, events = stream(server, {"model": MODEL, **fields})
    assert response.status_code == 200, response.text
    assert events and events[-1] == "[DONE]", events[-3:]
    assert "[DONE]" not in events[:-1]
    return events[:-1]


@dataclass
class MergedChoice:
    """One choice put back together from its stream chunks, in the shape of a non-streamed choice."""

    text: str = ""
    finish_reason: str | None = None
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    has_logprobs: bool = False

    def as_choice(self, index: int) -> dict[str, Any]:
        logprobs = None
        if self.has_logprobs:
            logprobs = {
                "tokens": self.tokens,
                "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset,
            }
        return {"text": self.text, "index": index, "logprobs": logprobs, "finish_reason": self.finish_reason}


def merge_stream(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stream's choices, in index order, each as a non-streamed choice would be."""
    merged: dict[int, MergedChoice] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            into = merged.setdefault(choice["index"], MergedChoice())
            into.text += choice["text"]
            if choice["finish_reason"] is not None:
                into.finish_reason = choice["finish_reason"]
            if choice["logprobs"] is not None:
                into.has_logprobs = True
                for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    getattr(into, name).extend(choice["logprobs"][name])
    return [merged[index].as_choice(index) for index in sorted(merged)]


def is_bytes_token(token: str) -> bool:
    """A token that is not whole UTF-8 by itself, written ``bytes:\\xNN...`` as OpenAI does."""
    return BYTES_TOKEN.match(token) is not None


def token_bytes(token: str) -> bytes:
    """The UTF-8 bytes a ``logprobs.tokens`` entry stands for (``bytes:\\xe5\\xb9`` → ``b"\\xe5\\xb9"``)."""
    if is_bytes_token(token):
        return bytes(int(pair, 16) for pair in token[len("bytes:") :].split("\\x")[1:])
    return token.encode("utf-8")


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def served_tokenizer(server):
    """The live server's tokenizer, loaded here as the server loads it (after the server has started,
    so the embedded model's converted copy exists).  For tests that need token ids of a text."""
    from pathlib import Path

    from django.conf import settings
    from transformers import AutoTokenizer

    from inference.model_loader import converted_gguf_dir, embedded_gguf_path

    source = settings.MODEL_PATH or converted_gguf_dir(embedded_gguf_path(), Path(settings.MODEL_CACHE_DIR))
    return AutoTokenizer.from_pretrained(source)
