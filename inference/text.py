"""Turning generated token ids into text: incremental detokenization and stop strings.

Streaming text must never split a UTF-8 character and never take text back.  The detokenizer
holds back a token's bytes until they decode to whole characters (the approach of vLLM's and
llama.cpp's servers), and :func:`stop_holdback` says how much of the end of the text could still
become a stop string, so that part is not released yet.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# How many prompt tokens seed the detokenizer, so the first generated token decodes with the
# spacing it has in context (sentencepiece tokenizers drop a leading space at the start of a text).
CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Decodes one sequence's generated tokens one at a time into text pieces.

    ``add(token_id)`` returns the new text that token completes: ``""`` while its bytes are not yet a
    whole UTF-8 character, then the whole character(s) with the token that completes them.
    The concatenated pieces equal ``tokenizer.decode`` of all generated tokens.

    Special tokens the model writes (``<|im_start|>``) are text like any other token, as they are
    in a prompt's: ``logprobs.tokens`` spell the text, and a stop string such as ``"<|im_start|>"``
    can match.  The end-of-sequence token never gets here: it ends the sequence and is not returned.
    ``skip_special_tokens=True`` decodes them to ``""`` instead.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prompt_ids: Sequence[int], skip_special_tokens: bool = False
    ) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._skip = skip_special_tokens

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        skip = self._skip
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=skip)
        new_text = decode(self._ids[self._prefix_offset :], skip_special_tokens=skip)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return new_text[len(prefix_text) :]
        return ""


def prompt_text_offsets(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], text: str) -> list[int]:
    """Each prompt token's ``text_offset`` in ``text``, the prompt as echoed.

    Tokens are decoded in turn with their special tokens (``<|im_start|>`` written in a prompt is
    in its text).  A special token that ``text`` does not hold at that point takes no room: one the
    tokenizer adds itself (a BOS), or the document start that stands in for an empty prompt.  Bytes
    of a character split over several tokens all sit where that character begins.
    """
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    offsets: list[int] = []
    position = 0
    for token_id in ids:
        offsets.append(position)
        piece = detokenizer.add(token_id)
        if not text.startswith(piece, position) and tokenizer.decode([token_id], skip_special_tokens=True) == "":
            continue
        position += len(piece)
    return offsets


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int:
    """The index in ``text`` where the earliest stop string begins, or -1.

    Only matches that end at or after ``start`` are new, so callers pass the length already checked
    minus the longest stop string, keeping the check linear over a generation.
    """
    best = -1
    for stop in stops:
        index = text.find(stop, max(0, start - len(stop) + 1))
        if index != -1 and (best == -1 or index < best):
            best = index
    return best


def stop_holdback(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could still be the start of a stop string.

    That tail is held back while streaming: it is released once it can no longer become a stop
    string, or dropped if it does.
    """
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def token_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    """A token's own text for ``logprobs.tokens``.

    A token that is not whole UTF-8 by itself is written ``bytes:\\xNN...`` as OpenAI does.
    """
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    raw = token_bytes(tokenizer, token_id)
    if raw is None:
        return text
    return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)


def token_bytes(tokenizer: PreTrainedTokenizerBase, token_id: int) -> bytes | None:
    """The raw bytes of a byte-level BPE token (GPT-2 style), or None for other tokenizers."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    table = _byte_decoder()
    if piece is None or any(char not in table for char in piece):
        return None
    return bytes(table[char] for char in piece)


_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """GPT-2's reversible byte-to-unicode table, inverted (Radford et al. 2019, encoder.py)."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
        printable += list(range(ord("®"), ord("ÿ") + 1))
        codes = printable[:]
        extra = 0
        for byte in range(256):
            if byte not in printable:
                printable.append(byte)
                codes.append(256 + extra)
                extra += 1
        _BYTE_DECODER = {chr(code): byte for byte, code in zip(printable, codes)}
    return _BYTE_DECODER
