"""The staff dashboard's WebSocket: the engine's live state every second, and new usage records.

The consumer runs in the daphne process that owns the engines (one per model served), so it reads
each ``engine.stats()`` directly.  Only active staff may connect; anyone else is refused before the handshake completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from inference import process

from .live import GROUP

logger = logging.getLogger(__name__)

INTERVAL_SECONDS = 1.0


def engine_stats() -> dict[str, Any]:
    """``{"ready", "running", "waiting", "tokens_per_second", "models"}`` of this process's engines:
    the sums (``ready`` once every model is), and ``models`` each model's own (``{"model", "ready",
    "running", "waiting", "tokens_per_second"}``, in the configured order); ``{"ready": False}``
    before the server has made them (the page then shows "loading")."""
    models = process.current()
    if models is None:
        return {"ready": False}
    each = [{"model": served.id, "ready": served.engine.ready, **served.engine.stats()} for served in models]
    return {
        "ready": all(model["ready"] for model in each),
        "running": sum(model["running"] for model in each),
        "waiting": sum(model["waiting"] for model in each),
        "tokens_per_second": round(sum(model["tokens_per_second"] for model in each), 1),
        "models": each,
    }


class EngineStatsConsumer(AsyncJsonWebsocketConsumer):
    """Sends ``{"type": "engine", ...}`` every second and ``{"type": "usage", ...}`` per new record."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not (user is not None and user.is_active and user.is_staff):
            await self.close()
            return
        if self.channel_layer is not None:
            await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        self.ticker = asyncio.create_task(self._tick())

    async def disconnect(self, code: int) -> None:
        ticker = getattr(self, "ticker", None)
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def _tick(self) -> None:
        while True:
            try:
                stats = {"type": "engine", **engine_stats()}
            except Exception:
                logger.exception("Could not read the engine's stats")
                stats = {"type": "engine", "ready": False}
            await self.send_json(stats)
            await asyncio.sleep(INTERVAL_SECONDS)

    async def usage_recorded(self, event: dict[str, Any]) -> None:
        await self.send_json({**event, "type": "usage"})
