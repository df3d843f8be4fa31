"""Keeping the serving process's resident memory close to what it uses (glibc's allocator).

The KV cache of a running batch is reallocated as rows join and leave and as it grows, and a
model load frees hundreds of megabytes of temporary tensors.  glibc keeps freed memory in its
heap unless told otherwise, so without these calls RSS creeps upwards after every burst.
Elsewhere (musl, macOS) both functions do nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


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


def mmap_large_allocations(threshold: int = 1 << 20) -> None:
    """Serve allocations of ``threshold`` bytes and more with mmap, so that freeing them (a KV-cache
    buffer, say) returns them to the system at once.  By default glibc raises its threshold after
    the first large free, and such buffers then stay in the heap.  Call once, before the model loads."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, threshold)


def trim() -> None:
    """Return the heap's free pages to the system (``malloc_trim(0)``); a few milliseconds."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
