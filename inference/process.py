"""The engine this server process serves: one per process, made on first use.

The engine takes its configuration as objects (:class:`~inference.engine.EngineConfig`,
:class:`~inference.model_loader.ModelConfig`); whoever reads the configuration (the API, from
Django's settings: ``api/engine.py``) hands a factory to :func:`get_or_create`.  Readers that must
not create one (the staff dashboard's live figures) ask :func:`current`.  Torch is not imported here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine

_engine: Engine | None = None
_lock = threading.Lock()


def get_or_create(make: Callable[[], Engine]) -> Engine:
    """The process's engine, made by ``make()`` on the first call (under a lock; not started)."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = make()
        return _engine


def current() -> Engine | None:
    """The process's engine if one was made, else ``None``."""
    return _engine
