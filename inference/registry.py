"""The models one process serves: every name a client may send (an id or an alias) to the engine serving it.

Each model has its own :class:`~inference.engine.Engine`: its own worker thread, queue, KV cache
and metrics (labelled with its ``model_name``), all in the one process, sharing its cores.  A
request for one model never waits in another's queue or batch; their steps interleave on the
cores, and our kernels' thread pool takes one caller at a time (``csrc/pool.h``), so two engines
never oversubscribe it.  Where the engines' thread counts are automatic (``ENGINE_NUM_THREADS=0``
outside the deterministic mode), each one's thread budget (:mod:`inference.thread_budget`) counts
the other's worker thread as other work and leaves it a core while it is busy.

:class:`ModelRegistry` is made once per process (:mod:`inference.process`), from the configuration
its reader hands in (``api/engine.py``, from ``MODELS_CONFIG`` or the single ``MODEL_*`` settings).
No Django, no torch here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .models_config import model_names

if TYPE_CHECKING:
    from .engine import Engine


@dataclass(frozen=True)
class ServedModel:
    """One model: its ``engine`` and the ``aliases`` it answers to besides its id (``engine.model_id``)."""

    engine: Engine
    aliases: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.engine.model_id

    @property
    def names(self) -> tuple[str, ...]:
        """The id, then the aliases in order, each once (``/v1/models`` lists them so)."""
        return model_names(self.id, self.aliases)


class ModelRegistry:
    """The served models in their configured order, the first being the default; each name names one.

    Raises ``ValueError`` when two models share a name (``MODELS_CONFIG``'s reader refuses that first,
    naming the tables).
    """

    def __init__(self, models: Iterable[ServedModel]) -> None:
        self.models = tuple(models)
        if not self.models:
            raise ValueError("a registry serves at least one model")
        self._by_name: dict[str, ServedModel] = {}
        for model in self.models:
            for name in model.names:
                if name in self._by_name:
                    raise ValueError(f"{name!r} names both {self._by_name[name].id!r} and {model.id!r}")
                self._by_name[name] = model

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def default(self) -> ServedModel:
        """The first model listed: the one a single-model deployment serves."""
        return self.models[0]

    @property
    def engines(self) -> list[Engine]:
        return [model.engine for model in self.models]

    def resolve(self, name: str) -> ServedModel | None:
        """The model that ``name`` (an id or an alias) names, or ``None``."""
        return self._by_name.get(name)

    @property
    def ready(self) -> bool:
        """Whether every engine has loaded its model."""
        return all(engine.ready for engine in self.engines)

    def start(self) -> None:
        """Start every engine's worker thread (each loads its model)."""
        for engine in self.engines:
            engine.start()

    def stop(self, timeout: float = 30) -> None:
        """Ask every engine to finish, then wait for them all within ``timeout`` seconds together."""
        deadline = time.monotonic() + timeout
        for engine in self.engines:
            engine.stop(timeout=0)  # each stops taking work at once; none waits for another's step
        for engine in self.engines:
            engine.stop(timeout=max(0.0, deadline - time.monotonic()))
