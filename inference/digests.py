"""Digests of files, the keys of what is cached from them (a leaf module: the loader and the
weight formats both use it)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=8)
def _content_digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()[:12]


def file_digest(path: Path) -> str:
    """The first 12 hex digits of the SHA-256 of the file at ``path``: the key of what is cached from
    it (read once per process and file version).  Raises
    ``OSError`` when the file cannot be read."""
    stat = Path(path).stat()
    return _content_digest(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
