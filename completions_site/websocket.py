"""The WebSocket route of last resort: a path no consumer serves is refused, quietly.

channels' ``URLRouter`` raises ``ValueError("No route found for path ...")`` for such a path, which
daphne logs as an application error with its traceback; a scanner's probes would fill the log.
:func:`refuse` closes the handshake instead, which daphne answers with a 403 (one access-log line,
``WSREJECT``).
"""

from __future__ import annotations

from typing import Any


async def refuse(scope: dict, receive: Any, send: Any) -> None:
    """ASGI app: wait for ``websocket.connect``, then close (daphne sends 403 to the handshake)."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})
