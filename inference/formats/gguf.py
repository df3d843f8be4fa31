"""Reading a GGUF file: its metadata, and its tensors where they lie in the file.

The format (ggml's ``docs/gguf.md``, version 2 and 3): the magic ``GGUF``, a version, the tensor and
metadata counts, the metadata as typed key/value pairs, one record per tensor (name, dimensions
innermost first, ggml type, offset in the data section), then the data section, aligned to
``general.alignment`` (32 by default).  All numbers are little-endian.

:class:`GGUFFile` parses the header in Python, fast enough for a Llama 3 tokenizer's 128,256 strings
(docs/performance.md#the-autotunes-noise-and-the-ggufs-blocks), and checks it whole before anything
is loaded: a file that is not a GGUF, is cut short, holds a tensor of a type
:mod:`inference.formats.ggml` does not know, or a tensor whose bytes do not fit its shape raises
:class:`ModelFileError` naming the problem.  Tensor data is memory-mapped, never
read into a copy: :meth:`GGUFFile.raw` returns a ``uint8`` view ``[rows, row_bytes]`` of the map.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from . import ggml

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Metadata value types (gguf.md's gguf_metadata_value_type): struct formats of the fixed-size ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class ModelFileError(ValueError):
    """A model file that cannot be loaded; the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's record: ``shape`` in torch's order (outermost first), where its bytes lie."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml.type_name(self.ggml_type)


class _Cursor:
    """Reads the header's little-endian values from a buffer, raising ModelFileError past its end."""

    def __init__(self, buffer: memoryview, path: Path) -> None:
        self.buffer, self.position, self.path = buffer, 0, path

    def take(self, size: int) -> memoryview:
        end = self.position + size
        if size < 0 or end > len(self.buffer):
            raise ModelFileError(f"{self.path}: the file ends inside its header (truncated?)")
        view = self.buffer[self.position : end]
        self.position = end
        return view

    def scalar(self, fmt: str):
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.take(size))[0]

    def string(self) -> str:
        data = self.take(self.scalar("<Q"))
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError:
            return bytes(data).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if item_kind in _SCALARS:  # one unpack for the whole array (token scores, types)
                fmt = _SCALARS[item_kind]
                data = self.take(struct.calcsize(fmt) * count)
                return list(struct.unpack(f"<{count}{fmt[1]}", data))
            return [self.value(item_kind) for _ in range(count)]
        raise ModelFileError(f"{self.path}: unknown metadata value type {kind}")


class GGUFFile:
    """A GGUF file, parsed and checked (see the module docstring); raises :class:`ModelFileError`.

    ``metadata``: ``{key: value}`` (strings, numbers, lists); ``tensors``: ``{name: TensorInfo}`` in
    the file's order.  The file stays mapped while the object or any tensor from :meth:`raw` lives.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as file:
                size = file.seek(0, 2)
                if size < 24:
                    raise ModelFileError(f"{self.path}: {size} bytes is too short for a GGUF file")
                # A private mapping is writable as torch.frombuffer wants; pages are never written,
                # so they stay the page cache's, shared with every process mapping the file.
                self._map = mmap.mmap(file.fileno(), 0, flags=mmap.MAP_PRIVATE)
        except OSError as error:
            raise ModelFileError(f"{self.path}: cannot read the file: {error}") from error
        self.size = size
        cursor = _Cursor(memoryview(self._map), self.path)
        magic = bytes(cursor.take(4))
        if magic != MAGIC:
            raise ModelFileError(f"{self.path}: not a GGUF file (its first bytes are {magic!r}, not {MAGIC!r})")
        self.version = cursor.scalar("<I")
        if self.version not in VERSIONS:
            raise ModelFileError(f"{self.path}: GGUF version {self.version} is not supported (only {VERSIONS})")
        tensor_count, metadata_count = cursor.scalar("<Q"), cursor.scalar("<Q")
        self.metadata: dict[str, object] = {}
        for _ in range(metadata_count):
            key = cursor.string()
            self.metadata[key] = cursor.value(cursor.scalar("<I"))
        records = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
            records.append((name, tuple(reversed(dims)), cursor.scalar("<I"), cursor.scalar("<Q")))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))  # type: ignore[call-overload]
        data_start = -(-cursor.position // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, kind, offset in records:
            self.tensors[name] = self._check_tensor(name, shape, kind, data_start + offset)

    def _check_tensor(self, name: str, shape: tuple[int, ...], kind: int, offset: int) -> TensorInfo:
        if name in self.tensors:
            raise ModelFileError(f"{self.path}: tensor {name} appears twice")
        if not ggml.is_known(kind):
            raise ModelFileError(
                f"{self.path}: tensor {name} has ggml type {ggml.type_name(kind)}, which this server cannot run "
                f"(supported: {', '.join(ggml.supported_names())})"
            )
        block, type_size = ggml.block_size(kind), ggml.type_size(kind)
        if not shape or shape[-1] % block:
            raise ModelFileError(
                f"{self.path}: tensor {name} of shape {list(shape)} is not whole {ggml.type_name(kind)} blocks"
            )
        nbytes = math.prod(shape) // block * type_size
        if offset + nbytes > self.size:
            raise ModelFileError(
                f"{self.path}: tensor {name} ends at byte {offset + nbytes}, past the file's end ({self.size} bytes): "
                "the file is truncated"
            )
        return TensorInfo(name, shape, kind, offset, nbytes)

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's bytes as a ``uint8`` view ``[rows, row_bytes]`` of the map (rows: all but the
        innermost dimension, flattened; a vector is one row).  No copy; never write into it."""
        info = self.tensors[name]
        rows = math.prod(info.shape[:-1])
        data = torch.frombuffer(self._map, dtype=torch.uint8, count=info.nbytes, offset=info.offset)
        return data.view(rows, info.nbytes // rows)

    def floats(self, name: str) -> torch.Tensor:
        """The tensor as a new float32 tensor of its shape (norm scales, small tensors, references)."""
        info = self.tensors[name]
        return ggml.dequantize(self.raw(name), info.ggml_type, info.shape[-1]).reshape(info.shape)

    def release(self, name: str) -> None:
        """Tell the kernel the tensor's pages are no longer needed here (after copying it): they leave
        this process's resident set, and stay in the page cache.  Best effort."""
        info = self.tensors[name]
        start = info.offset - info.offset % mmap.PAGESIZE
        try:
            self._map.madvise(mmap.MADV_DONTNEED, start, info.offset + info.nbytes - start)
        except (OSError, ValueError, AttributeError):
            pass

    def get(self, key: str, default=None):
        """A metadata value, or ``default``."""
        return self.metadata.get(key, default)

    def require(self, key: str):
        """A metadata value; raises :class:`ModelFileError` when the file lacks it."""
        if key not in self.metadata:
            raise ModelFileError(f"{self.path}: the metadata lacks {key}")
        return self.metadata[key]
