"""Turning generated token ids into text: incremental detokenization and stop strings.

Streaming text must never split a UTF-8 character and never take text back.  The detokenizer
holds back a token's bytes until they decode to whole characters (the approach of vLLM's and
llama.cpp's servers), and :class:`StopMatcher` says how much of the end of the text could still
become a stop string, so that part is not released yet.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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
        decode: Callable[..., str] = self._tokenizer.decode
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
            # What follows reads as the text's start: after a BOS a SentencePiece word's space is
            # the tokenizer's own prefix, which the text does not hold.
            detokenizer = IncrementalDetokenizer(tokenizer, [])
            continue
        if piece.startswith(" ") and not text.startswith(piece, position) and text.startswith(piece[1:], position):
            # A space the tokenizer put in itself (Phi-3's after a special token) takes no room.
            piece = piece[1:]
        position += len(piece)
    return offsets


class StopMatcher:
    """Finds stop strings in text fed to it piece by piece, in time linear in the text.

    Each stop string has a Knuth-Morris-Pratt automaton (Knuth, Morris, Pratt 1977) whose state
    is the length of the longest prefix of that stop string ending the text so far; so
    :attr:`holdback`, the longest tail of the text that could still become a stop string, is
    the largest state.  :meth:`feed` returns where the first completed stop string begins.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [stop for stop in stops if stop]
        self._failure = [_prefix_function(stop) for stop in self.stops]
        self._states = [0] * len(self.stops)
        self._length = 0  # characters fed so far

    @property
    def holdback(self) -> int:
        return max(self._states, default=0)

    def feed(self, piece: str) -> int:
        """Feed the next ``piece`` of text; return the index (in all text fed) where the first stop
        string to complete begins, or -1.  Of several completing at the same character, the
        earliest-beginning one wins."""
        for char in piece:
            self._length += 1
            found = -1
            for i, stop in enumerate(self.stops):
                state, failure = self._states[i], self._failure[i]
                while state and stop[state] != char:
                    state = failure[state - 1]
                if stop[state] == char:
                    state += 1
                if state == len(stop):
                    start = self._length - len(stop)
                    found = start if found == -1 else min(found, start)
                    state = failure[state - 1]
                self._states[i] = state
            if found != -1:
                return found
        return -1


def _prefix_function(pattern: str) -> list[int]:
    """``failure[i]``: the length of the longest proper prefix of ``pattern[:i + 1]`` that is also its suffix."""
    failure = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = failure[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        failure[i] = k
    return failure


def token_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    """A token's own text for ``logprobs.tokens``: the text it adds after other text, so a
    SentencePiece word keeps its leading space, which decoding the token alone strips.

    A token that is not whole UTF-8 by itself is written ``bytes:\\xNN...`` as OpenAI does.
    """
    kind, added = _vocabulary(tokenizer)
    if kind == "sentencepiece" and (raw := _token_bytes(tokenizer, token_id, kind, added)) is not None:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return _bytes_text(raw)
    # Other vocabularies read as their decoder writes them (a clean-up of spaces included); their
    # bytes are looked up only where that text is not whole UTF-8.
    text: str = tokenizer.decode([token_id])
    if "\ufffd" in text and (raw := _token_bytes(tokenizer, token_id, kind, added)) is not None:
        return _bytes_text(raw)
    return text


def _bytes_text(raw: bytes) -> str:
    return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)


def token_bytes(tokenizer: PreTrainedTokenizerBase, token_id: int) -> bytes | None:
    """The raw bytes of a vocabulary token: a byte-level BPE token's (GPT-2's alphabet), or a
    SentencePiece token's (``▁`` a space, a byte-fallback ``<0xNN>`` token its byte); None for an
    added token (its text is its content) or a token of another kind of vocabulary."""
    return _token_bytes(tokenizer, token_id, *_vocabulary(tokenizer))


def _token_bytes(tokenizer: PreTrainedTokenizerBase, token_id: int, kind: str, added: frozenset[int]) -> bytes | None:
    if token_id in added:
        return None
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(piece, str):
        return None
    if kind == "sentencepiece":
        if match := _BYTE_FALLBACK.fullmatch(piece):
            return bytes([int(match.group(1), 16)])
        return piece.replace("\u2581", " ").encode()
    table = _byte_decoder()
    if any(char not in table for char in piece):
        return None
    return bytes(table[char] for char in piece)


_BYTE_FALLBACK = re.compile("<0x([0-9A-Fa-f]{2})>")
# tokenizer -> (its vocabulary's kind, its added tokens' ids); weak, so that a tokenizer let go is
# freed.  No lock: two threads that both miss compute the same entry.
_VOCABULARIES: weakref.WeakKeyDictionary[Any, tuple[str, frozenset[int]]] = weakref.WeakKeyDictionary()


def _vocabulary(tokenizer: PreTrainedTokenizerBase) -> tuple[str, frozenset[int]]:
    """``(kind, added)``: ``sentencepiece`` where the tokenizer's decoder reads ``▁`` and byte
    fallback (Llama's, Mistral's, Phi-3's and Gemma's), else ``other``; the ids of its added tokens."""
    known = _VOCABULARIES.get(tokenizer)
    if known is None:
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        kinds = _types(json.loads(decoder.__getstate__())) if decoder is not None else set()
        kind = "sentencepiece" if kinds & {"ByteFallback", "Metaspace"} and "ByteLevel" not in kinds else "other"
        known = _VOCABULARIES[tokenizer] = (kind, frozenset(tokenizer.added_tokens_decoder))
    return known


def _types(state: Any) -> set[str]:
    """Every ``type`` named in a serialized decoder (a ``Sequence`` names its parts')."""
    if isinstance(state, dict):
        found = {state["type"]} if isinstance(state.get("type"), str) else set()
        return found.union(*(_types(value) for value in state.values()))
    if isinstance(state, list):
        return set().union(*(_types(value) for value in state))
    return set()


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
