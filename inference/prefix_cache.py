"""Automatic prefix caching: prompts' keys and values kept after their prefill, for later prompts
that begin with the same tokens.

A prompt sent again (a client retrying, a benchmark cycling through its prompts, few-shot
evaluation repeating its examples, chat turns resending the conversation) then prefills only the
tokens after the longest cached prefix.  The idea is vLLM's automatic prefix caching
(``vllm/v1/core/kv_cache_utils.py``: a hash per block of tokens, chained to the blocks before it)
and llama.cpp server's ``cache_prompt``; here the cache is a least-recently-used store of whole
prompts' caches within a byte budget, found by chained hashes of their 16-token blocks or by the
whole prompt.

The reused positions were computed in another batch, so their last bits may differ from a
prefill from scratch (as in vLLM and llama.cpp, whose documentation says the same); the engine
leaves the cache off in the deterministic mode.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BLOCK_TOKENS = 16  # prefixes are found at multiples of this many tokens, or as a whole stored prompt


@dataclass(frozen=True)
class CachedPrompt:
    """One stored prompt: ``token_ids`` and their ``keys``/``values`` ``[layers, kv_heads, >= len(token_ids), head_dim]``
    (positions ``0..len(token_ids)-1`` hold them; columns after are spare room and are never read)."""

    token_ids: tuple[int, ...]
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Bytes the entry's tensors span."""
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))


def block_hashes(token_ids: Sequence[int]) -> list[int]:
    """Chained hashes of the whole blocks of :data:`BLOCK_TOKENS` tokens: hash ``i`` names tokens
    ``0 .. (i + 1) * BLOCK_TOKENS - 1`` (vLLM's block hash chain)."""
    hashes, previous = [], 0
    for index in range(len(token_ids) // BLOCK_TOKENS):
        previous = hash((previous, tuple(token_ids[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS])))
        hashes.append(previous)
    return hashes


class PrefixCache:
    """Stored prompts' caches, least recently used dropped first when they pass ``capacity_bytes``.

    :meth:`store` keeps a prompt's cache (the tensors as given: the caller must not write them
    afterwards); :meth:`lookup` finds the longest stored prefix of a prompt, verified token by
    token (a hash collision is never taken for a match).  :meth:`shrink` lowers the capacity below
    ``capacity_bytes`` for a while (the owner's other memory needs); a prompt bigger than half of
    ``capacity_bytes`` is never stored, so one long prompt does not evict every other.  Not thread-safe.
    """

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must not be negative")
        self.budget_bytes = capacity_bytes  # the most it ever holds
        self.capacity_bytes = capacity_bytes  # what it may hold now (shrink)
        self.nbytes = 0
        self.stores = 0  # prompts stored so far
        self._entries: collections.OrderedDict[tuple[int, ...], CachedPrompt] = collections.OrderedDict()
        # chained block hash -> the entries holding that prefix, the latest last
        self._blocks: dict[int, list[CachedPrompt]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, token_ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Keep the cache of prompt ``token_ids`` (``keys``/``values`` as in :class:`CachedPrompt`),
        evicting the least recently used entries to make room.  Returns whether it was stored
        (False: the cache is off, the prompt is too big, or it is stored already, which only
        marks it recently used)."""
        tokens = tuple(token_ids)
        if tokens in self._entries:
            self._entries.move_to_end(tokens)
            return False
        entry = CachedPrompt(tokens, keys, values)
        if not tokens or 2 * entry.nbytes > self.budget_bytes or entry.nbytes > self.capacity_bytes:
            return False
        while self.nbytes + entry.nbytes > self.capacity_bytes:
            self._evict()
        self._entries[tokens] = entry
        self.nbytes += entry.nbytes
        for block_hash in block_hashes(tokens):
            self._blocks.setdefault(block_hash, []).append(entry)
        self.stores += 1
        return True

    def lookup(self, token_ids: Sequence[int]) -> tuple[CachedPrompt, int] | None:
        """The stored entry sharing the longest prefix with ``token_ids`` and that prefix's length
        in tokens, or None.  Found by the whole prompt, or by whole blocks of :data:`BLOCK_TOKENS`
        (a prefix shorter than one block is found only as a whole stored prompt); the entry found
        by the last shared block counts as far as it agrees.  The entry becomes the most recently used."""
        tokens = tuple(token_ids)
        entry = self._entries.get(tokens)
        if entry is not None:
            self._entries.move_to_end(tokens)
            return entry, len(tokens)
        found, length = None, 0
        for index, block_hash in enumerate(block_hashes(tokens)):
            holders = self._blocks.get(block_hash)
            end = (index + 1) * BLOCK_TOKENS
            if not holders or holders[-1].token_ids[:end] != tokens[:end]:
                break
            found, length = holders[-1], end
        if found is None:
            return None
        # The entry may agree past its last whole shared block (a conversation resent with one more turn).
        stored = found.token_ids
        while length < min(len(stored), len(tokens)) and stored[length] == tokens[length]:
            length += 1
        self._entries.move_to_end(stored)
        return found, length

    def shrink(self, capacity_bytes: int) -> None:
        """Set the capacity to ``capacity_bytes`` (>= 0; at most the budget given at construction),
        evicting the least recently used entries until they fit."""
        self.capacity_bytes = min(capacity_bytes, self.budget_bytes)
        while self.nbytes > self.capacity_bytes:
            self._evict()

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
        self._blocks.clear()
        self.nbytes = 0

    def _evict(self) -> None:
        tokens, entry = self._entries.popitem(last=False)
        self.nbytes -= entry.nbytes
        for block_hash in block_hashes(tokens):  # other entries holding a block still find it
            holders = [holder for holder in self._blocks.get(block_hash, ()) if holder is not entry]
            if holders:
                self._blocks[block_hash] = holders
            else:
                self._blocks.pop(block_hash, None)
