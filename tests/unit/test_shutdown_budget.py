"""Graceful shutdown's time budget: after the grace period, every step shares one deadline."""

from __future__ import annotations

import asyncio
import time

from api import draining
from completions_site import shutdown


class Usage:
    """Stands in for a request that never finishes."""


class StuckEngine:
    ready = True

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id

    def stop(self, timeout: float) -> None:
        time.sleep(timeout)  # an engine that takes all the time it is given


def test_everything_after_the_grace_period_fits_in_one_finishing_budget(monkeypatch, settings):
    settings.SHUTDOWN_GRACE_SECONDS = 0.2
    monkeypatch.setattr(shutdown, "FINISH_SECONDS", 0.6)
    state = draining.DrainState()
    monkeypatch.setattr(draining, "state", state)
    from inference.registry import ModelRegistry, ServedModel

    stuck_models = ModelRegistry([ServedModel(StuckEngine("small")), ServedModel(StuckEngine("big"))])
    monkeypatch.setattr("api.engine.get_models", lambda: stuck_models)  # two engines, one budget for both
    stuck = Usage()

    async def scenario() -> tuple[float, int]:
        state.opened(stuck)  # a request that never ends...
        state.writing(asyncio.sleep(60))  # ...and a usage write that never finishes
        stopped: list[int] = []
        drainer = shutdown.Drainer(asyncio.get_running_loop(), lambda: stopped.append(1))
        started = time.monotonic()
        await drainer.drain()
        await drainer._written()  # the reactor's before-shutdown trigger
        return time.monotonic() - started, len(stopped)

    seconds, stops = asyncio.run(scenario())

    assert stops == 1
    assert seconds < 0.2 + 0.6 + 0.3  # grace + the one budget + scheduling slack
