"""inference.memory: glibc's thresholds as the engine sets them (in a fresh interpreter each)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from inference import memory

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


ZEROED_PROBE = """
import os
import torch
from inference import memory

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

before = resident()
buffer = memory.zeroed((256, 1024, 1024), torch.float16, torch.device("cpu"))  # 512 MiB
zero = not buffer.any()  # reads every page: the kernel's zero page, resident nowhere
created = resident() - before
buffer[:64] = 1  # a quarter
written = resident() - before
del buffer
print(created, int(zero), written, resident() - before)
"""


def test_zeroed_maps_its_pages_at_first_touch():
    """A KV-cache buffer that may never fill: creating it writes nothing, what is written becomes
    resident, and freeing it returns that at once (in a fresh interpreter each)."""
    out = subprocess.run([sys.executable, "-c", ZEROED_PROBE], capture_output=True, text=True, check=True).stdout
    created, zero, written, freed = map(int, out.split())
    assert created < 16 << 20  # after reading it all
    assert zero
    assert 120 << 20 < written < 200 << 20  # 128 MiB written
    assert freed < 16 << 20
    assert memory.zeroed((0, 4), torch.float32, torch.device("cpu")).shape == (0, 4)
