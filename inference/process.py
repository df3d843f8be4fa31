"""The models this server process serves, one engine each: made once, on first use.

The engines take their configuration as objects (:class:`~inference.engine.EngineConfig`,
:class:`~inference.model_loader.ModelConfig`); whoever reads the configuration (the API, from
Django's settings: ``api/engine.py``) hands a factory of the :class:`~inference.registry.ModelRegistry`
to :func:`get_or_create`.  Readers that must not create one (the staff dashboard's live figures) ask
:func:`current`.  Torch is not imported here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .registry import ModelRegistry

_models: ModelRegistry | None = None
_lock = threading.Lock()


def get_or_create(make: Callable[[], ModelRegistry]) -> ModelRegistry:
    """The process's models, made by ``make()`` on the first call (under a lock; not started)."""
    global _models
    with _lock:
        if _models is None:
            _models = make()
        return _models


def current() -> ModelRegistry | None:
    """The process's models if they were made, else ``None``."""
    return _models
