"""inference.memory: glibc's thresholds as the engine sets them (in a fresh interpreter each)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")

PROBE = """
import ctypes
from inference import memory

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
memory.tune_allocator()
mapped = libc.mallinfo2().hblkhd
small = libc.malloc(16 << 20)  # a pass's temporary
small_mapped = libc.mallinfo2().hblkhd - mapped
libc.free(small)
large = libc.malloc(64 << 20)  # a KV-cache buffer
large_mapped = libc.mallinfo2().hblkhd - mapped
libc.free(large)
print(small_mapped, large_mapped, libc.mallinfo2().hblkhd - mapped)
"""


def test_pass_temporaries_come_from_the_heap_and_large_buffers_are_mapped():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    small_mapped, large_mapped, after_free = map(int, out.split())
    assert small_mapped == 0  # not a fresh mapping
    assert large_mapped >= 64 << 20
    assert after_free == 0  # returned at once
