"""Keeping the serving process's resident memory close to what it uses, and its temporaries cheap
(glibc's allocator).

The KV cache of a running batch is reallocated as rows join and leave and as it grows, and a
model load frees hundreds of megabytes of temporary tensors; a forward pass allocates and frees
tensors of tens of megabytes per layer.  Memory the kernel maps afresh costs a page fault per 4 KB
at first touch (as long as the copy that fills it), so the passes' temporaries are better reused
from the heap, and the largest buffers better returned at once.  Elsewhere (musl, macOS) these
functions do nothing.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import sys

import torch

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 32 << 20  # bytes from which an allocation is its own mapping (glibc's own maximum)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc has both; musl has no malloc_trim
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator(mmap_threshold: int = MMAP_THRESHOLD) -> None:
    """Serve allocations of ``mmap_threshold`` bytes and more with their own mappings, so that freeing
    them (a large KV-cache buffer, a load's temporaries) returns them to the system at once, and
    smaller ones from the heap, so that a pass's temporaries mostly reuse pages already faulted in
    (the engine calls :func:`trim` once it idles; the batch's KV cache has mappings of its own,
    :func:`zeroed`).  By default
    glibc maps every allocation of 128 KB and more afresh until its first large free.  Call once,
    before the model loads."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)


def trim() -> None:
    """Return the heap's free pages to the system (``malloc_trim(0)``); a few milliseconds."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-filled tensor; on the CPU over its own anonymous mapping, whose pages the kernel maps at
    their first touch, so that creating it costs no time and its untouched pages no memory
    (``torch.zeros`` writes every byte at once: a pause of a whole step or more for a KV cache that
    may never fill); freeing it unmaps it."""
    size = math.prod(shape) * dtype.itemsize
    if size == 0 or device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    # Private: reading an unwritten page maps the kernel's zero page (a shared mapping would allocate it).
    return torch.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE), dtype=torch.uint8).view(dtype).view(shape)
