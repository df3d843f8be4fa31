"""The running batch's ``past_key_values``: left-padded rows in buffers that grow in place.

transformers' ``DynamicLayer`` concatenates every step, copying the whole cache once per token
(at 32 rows of 512 tokens that is hundreds of megabytes a step).  :class:`GrowingLayer` keeps each
layer's keys and values in a buffer with spare columns and writes a step's new column in place;
it copies only when the buffer is full (growing by a fixed number of columns, so memory stays
close to what the rows use) or when rows join or leave the batch.

Rows are left-padded: every row's last token is in the same column, so a decode step appends one
column for all rows.  The engine keeps the matching ``attention_mask`` (0 on padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SPARE_COLUMNS = 32  # a full buffer is copied once per this many decode steps


class GrowingLayer(DynamicLayer):
    """One layer's keys and values, ``[batch, kv_heads, width, head_dim]``, in a buffer with spare width.

    ``keys`` and ``values`` are views of the used columns, as transformers' layers expose them.
    """

    def __init__(self) -> None:
        super().__init__()
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._width = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states``/``value_states`` (``[batch, kv_heads, new, head_dim]``) after the used columns."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._width + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._reserve(key_states, end)
        key_buffer, value_buffer = self._buffers()
        key_buffer[:, :, self._width : end] = key_states
        value_buffer[:, :, self._width : end] = value_states
        return self._set_width(end)

    def get_seq_length(self) -> int:
        return self._width

    def used(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``keys`` and ``values``, the used columns; raises ``AssertionError`` before the first update."""
        assert self.keys is not None and self.values is not None, "the layer has not been updated yet"
        return self.keys, self.values

    def assign(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the contents with ``keys``/``values`` (``[batch, kv_heads, width, head_dim]``)."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        self._key_buffer = self._value_buffer = None
        self._width = 0
        self.update(keys, values)

    def _reserve(self, like: torch.Tensor, columns: int) -> None:
        """Grow the buffers to at least ``columns`` plus spare room, keeping the used columns."""
        capacity = columns + SPARE_COLUMNS
        batch, heads, _, dim = like.shape
        key_buffer = like.new_zeros(batch, heads, capacity, dim)
        value_buffer = like.new_zeros(batch, heads, capacity, dim)
        if self._key_buffer is not None and self._width:
            old_keys, old_values = self._buffers()
            key_buffer[:, :, : self._width] = old_keys[:, :, : self._width]
            value_buffer[:, :, : self._width] = old_values[:, :, : self._width]
        self._key_buffer, self._value_buffer = key_buffer, value_buffer

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers, which :meth:`_reserve` allocates together."""
        assert self._key_buffer is not None and self._value_buffer is not None, "no buffers reserved yet"
        return self._key_buffer, self._value_buffer

    def _set_width(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Make ``keys`` and ``values`` the views of the first ``width`` columns; returns them."""
        key_buffer, value_buffer = self._buffers()
        self._width = width
        self.keys, self.values = key_buffer[:, :, :width], value_buffer[:, :, :width]
        return self.keys, self.values


class BatchKVCache(DynamicCache):
    """A ``DynamicCache`` of :class:`GrowingLayer` s with the batch operations continuous batching needs.

    Raises ``NotImplementedError`` for models with sliding-window or other non-full-attention
    layers, whose caches cannot be left-padded this way.
    """

    layers: list[GrowingLayer]

    def __init__(self, config) -> None:
        super().__init__(config=config)
        if any(type(layer) is not DynamicLayer for layer in self.layers):
            raise NotImplementedError(
                "Only models whose layers all use full attention are supported (no sliding windows)."
            )
        self.layers = [GrowingLayer() for _ in self.layers]

    @property
    def width(self) -> int:
        return self.layers[0].get_seq_length()

    @property
    def rows(self) -> int:
        """The batch's row count; raises ``AssertionError`` before the first update."""
        return self.layers[0].used()[0].shape[0]

    def join(self, parts: Sequence[tuple[BatchKVCache, torch.Tensor, int]]) -> None:
        """Append rows of other caches, in one copy: for each ``(cache, rows, first_column)``, rows
        ``rows`` (``[k]`` int64, repeats allowed) of ``cache`` from column ``first_column`` on,
        left-padding whichever rows are shorter than the widest."""
        width = self.width
        widths = [cache.width - first for cache, _, first in parts]
        total = max([width, *widths])
        for index, mine in enumerate(self.layers):
            keys, values = [], []
            if width:
                my_keys, my_values = mine.used()
                keys.append(_pad_left(my_keys, total - width))
                values.append(_pad_left(my_values, total - width))
            for (cache, rows, first), part_width in zip(parts, widths):
                their_keys, their_values = cache.layers[index].used()
                keys.append(_pad_left(their_keys.index_select(0, rows)[:, :, first:], total - part_width))
                values.append(_pad_left(their_values.index_select(0, rows)[:, :, first:], total - part_width))
            mine.assign(torch.cat(keys), torch.cat(values))

    def select(self, rows: torch.Tensor, first_column: int) -> None:
        """Keep batch ``rows`` (``[k]`` int64) and the columns from ``first_column`` on."""
        for layer in self.layers:
            keys, values = layer.used()
            layer.assign(
                keys.index_select(0, rows)[:, :, first_column:], values.index_select(0, rows)[:, :, first_column:]
            )


def _pad_left(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    """Pad ``[batch, heads, width, dim]`` with ``columns`` zero columns on the left of ``width``."""
    if columns == 0:
        return tensor
    return torch.nn.functional.pad(tensor, (0, 0, columns, 0))
