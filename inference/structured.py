"""Structured output: grammar-constrained decoding with llguidance, one matcher per sequence.

A request's ``response_format`` (``json_object`` or ``json_schema``) becomes a JSON-schema grammar
that :func:`compile_json_grammar` compiles once per (tokenizer, schema) and caches.  Each
candidate sequence gets its own :class:`GrammarMatcher` (a copy of the compiled one, so rows of a
batch never share parser state).  The engine calls, per decode step and per constrained row:

1. :meth:`GrammarMatcher.mask_logits` on the row's logits ``[vocab]`` after ``logit_bias`` and
   penalties, before temperature, sampling and logprobs: tokens the grammar forbids become
   ``-inf``, so neither sampling nor greedy decoding can pick them;
2. :meth:`GrammarMatcher.accept` with the sampled token; it returns True once the grammar is
   complete (only the end-of-sequence token could follow), which ends the sequence with
   ``finish_reason: "stop"``.

llguidance (Microsoft's Low-level Guidance, the Rust core behind ``guidance``) was chosen over
xgrammar by ``bench/structured_mask_cost.py``: both fill a 49152-token mask in tens of µs per step
on our CPU, far below a decode step; llguidance is one dependency-free wheel, where xgrammar pulls
in triton and apache-tvm-ffi.  Unconstrained rows never touch this module.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy  # not llguidance.torch: importing it loads torch.compile's machinery (48 MB RSS)
import numpy as np
import torch

CACHE_SIZE = 64  # compiled grammars kept: a deep copy of one costs far less than a compile
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}  # ``json_object``: any JSON object
# Compact JSON (``{"a":1,"b":[2]}``, as OpenAI's structured outputs look): with free whitespace a
# small model can emit blank lines until max_tokens, and the output is never whole.
JSON_OPTIONS: Any = {"whitespace_flexible": False}  # llguidance's JsonCompileOptions, a TypedDict


_BITS = torch.arange(32, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set ``logits`` ``[vocab]`` to ``-inf`` where ``bitmask`` (int32 ``[ceil(vocab / 32)]``, bit ``i % 32``
    of word ``i // 32`` set: token ``i`` allowed, llguidance's layout) forbids them, in place.

    On the CPU with numpy's ``unpackbits``, elsewhere with torch operations.  Not llguidance's
    ``apply_token_bitmask_inplace``: a ``torch.compile`` function, compiled in the middle of the first
    structured request after a start and slow beside busy threads
    (docs/performance.md#structured-outputs-mask-cost).
    """
    vocab = logits.shape[0]
    if logits.device.type == "cpu" and bitmask.device.type == "cpu" and logits.is_contiguous():
        words = bitmask.numpy().astype("<i4", copy=False)  # little-endian words: byte j holds bits 8j..8j+7
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
        values = logits.numpy()
        np.copyto(values[: allowed.shape[0]], -np.inf, where=allowed == 0)
        values[allowed.shape[0] :] = -np.inf  # tokens past the mask's words (none for a well-sized mask)
        return
    allowed_bits = ((bitmask[:, None] >> _BITS.to(bitmask.device)) & 1).reshape(-1)[:vocab]
    logits[: allowed_bits.shape[0]].masked_fill_(allowed_bits == 0, float("-inf"))
    logits[allowed_bits.shape[0] :] = float("-inf")


class GrammarError(ValueError):
    """The grammar library cannot compile a schema (its message says why)."""


class GrammarMatcher:
    """The parser state of one constrained sequence; used by the engine's worker thread only."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos_token_id: int) -> None:
        self._matcher = matcher
        self._bitmask = llguidance.numpy.allocate_token_bitmask(1, vocab_size)  # [1, ceil(vocab/32)] int32
        self._eos_token_id = eos_token_id

    def mask_logits(self, logits: torch.Tensor) -> None:
        """Set the logits ``[vocab]`` (float32, CPU or GPU) of forbidden tokens to ``-inf``, in place.

        Once the grammar is complete or broken only the end-of-sequence token stays allowed, so
        a row is never left with no token at all (softmax of all ``-inf`` would be NaN).
        """
        if self._matcher.is_stopped() or self._matcher.is_error():
            keep = logits[self._eos_token_id].clone()
            logits.fill_(float("-inf"))
            logits[self._eos_token_id] = keep
            return
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        apply_bitmask(logits, torch.from_numpy(self._bitmask[0]).to(logits.device))

    def accept(self, token_id: int) -> bool:
        """Advance past the sampled ``token_id``; True when the grammar is complete (the value is whole)."""
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token_id)
        return self._matcher.is_stopped()


class CompiledGrammar:
    """A compiled JSON-schema grammar; :meth:`matcher` hands out independent per-sequence matchers."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos_token_id: int) -> None:
        self._template = matcher
        self._vocab_size = vocab_size
        self._eos_token_id = eos_token_id

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy(), self._vocab_size, self._eos_token_id)


_lock = threading.Lock()
_tokenizers: dict[tuple[int, int], tuple[Any, llguidance.LLTokenizer]] = {}
_grammars: OrderedDict[tuple[int, int, str], CompiledGrammar] = OrderedDict()


def compile_json_grammar(tokenizer: Any, vocab_size: int, schema: dict[str, Any] | None) -> CompiledGrammar:
    """The grammar of compact JSON text valid against ``schema`` (``None``: any JSON object), cached.

    ``tokenizer`` is the model's Hugging Face tokenizer and ``vocab_size`` the width of its logits
    (the output embedding's, which may exceed the tokenizer's).  The grammar ends at its
    end-of-sequence token.  Raises :class:`GrammarError` for a schema llguidance cannot compile
    (unsupported keywords, a look-around ``pattern``, a malformed schema).  Thread-safe; compile
    in a worker thread (a large schema takes milliseconds).
    """
    text = json.dumps(ANY_JSON_OBJECT if schema is None else schema, sort_keys=True, separators=(",", ":"))
    key = (id(tokenizer), vocab_size, text)
    with _lock:
        if key in _grammars:
            _grammars.move_to_end(key)
            return _grammars[key]
    ll_tokenizer = _ll_tokenizer(tokenizer, vocab_size)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    except (ValueError, TypeError, RuntimeError) as error:
        raise GrammarError(str(error)) from error
    if matcher.is_error():
        raise GrammarError(matcher.get_error().strip())
    compiled = CompiledGrammar(matcher, vocab_size, ll_tokenizer.eos_token)
    with _lock:
        _grammars[key] = compiled
        while len(_grammars) > CACHE_SIZE:
            _grammars.popitem(last=False)
    return compiled


def _ll_tokenizer(tokenizer: Any, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of ``tokenizer`` (built once: it walks the whole vocabulary)."""
    key = (id(tokenizer), vocab_size)
    with _lock:
        if key not in _tokenizers:
            # Keep the tokenizer itself alive with it, so its id() is never reused by another.
            _tokenizers[key] = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size))
        return _tokenizers[key][1]
