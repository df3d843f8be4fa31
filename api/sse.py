"""The Server-Sent Events wire format of the streamed Completions API, in one place.

Each event is ``data: <one-line JSON>\\n\\n``; the stream ends with ``data: [DONE]\\n\\n``.  While
nothing is ready for ``keepalive`` seconds a ``: keep-alive`` comment goes out, so proxies keep
the connection open during a long prefill or a queue wait.  An error after the first byte is one
in-band ``data: {"error": {...}}`` event, followed by ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"


# Characters that JSON leaves as they are but that Python's str.splitlines, and so httpx's
# aiter_lines, takes for line ends (SSE itself ends lines at CR and LF only): escaped, so that a
# generated U+2028 cannot cut an event in two for such a client (an end-to-end test met one).
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event(data: Mapping[str, object]) -> bytes:
    """One ``data:`` event holding ``data`` as compact JSON on one line, for any line splitter."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKS)
    return b"data: " + text.encode() + b"\n\n"


async def with_keepalive(source: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    """Yield ``source``'s items, and :data:`KEEPALIVE` whenever none came for ``interval`` seconds."""
    iterator = source.__aiter__()
    pending: asyncio.Task | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield KEEPALIVE
                continue
            task, pending = pending, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if pending is not None:
            pending.cancel()
