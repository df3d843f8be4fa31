"""The process's engine, built once from Django settings.

``inference`` knows nothing of Django: it takes a :class:`~inference.model_loader.ModelConfig` and
an :class:`~inference.engine.EngineConfig`.  This module reads the settings (``MODEL_*`` and
``ENGINE_*``, see ``completions_site/settings.py``) into those objects and makes the one engine a
server process serves (kept by :mod:`inference.process`).  Torch is imported on the first call,
not at import time, so that the views and the management commands load without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

from inference import process

if TYPE_CHECKING:
    from inference.engine import Engine, EngineConfig
    from inference.model_loader import ModelConfig


def engine_configs() -> tuple[ModelConfig, EngineConfig]:
    """The model's and the engine's configuration from the current settings."""
    from inference.engine import EngineConfig
    from inference.model_loader import ModelConfig

    model = ModelConfig(
        path=settings.MODEL_PATH,
        model_id=settings.MODEL_ID,
        device=settings.MODEL_DEVICE,
        dtype=settings.MODEL_DTYPE,
        weights=settings.MODEL_WEIGHTS,
        cache_dir=settings.MODEL_CACHE_DIR,
    )
    engine = EngineConfig(
        max_batch_size=settings.ENGINE_MAX_BATCH_SIZE,
        max_queue=settings.ENGINE_MAX_QUEUE,
        prefill_chunk=settings.ENGINE_PREFILL_CHUNK,
        num_threads=settings.ENGINE_NUM_THREADS,
        runner=settings.ENGINE_RUNNER,
        kv_cache_dtype=settings.ENGINE_KV_CACHE_DTYPE,
        prefix_caching=settings.ENGINE_PREFIX_CACHING,
        prefix_cache_mb=settings.ENGINE_PREFIX_CACHE_MB,
        activation_bits=8 if settings.ENGINE_Q8_ACTIVATIONS else 16,
        k_quant_int8=settings.ENGINE_K_QUANT_Q8_ACTIVATIONS,
        freeze_gc=True,  # a serving process keeps what it loaded until it exits
        exit_on_load_failure=True,
    )
    return model, engine


def get_engine() -> Engine:
    """The process's engine, created on first use (never at import time); not started here."""
    return process.get_or_create(_make_engine)


def _make_engine() -> Engine:
    from inference.engine import Engine

    return Engine(*engine_configs())


def served_models(model_id: str) -> list[str]:
    """The names the model ``model_id`` answers to: its id, then ``MODEL_ALIASES`` in order."""
    return [model_id, *(alias for alias in settings.MODEL_ALIASES if alias != model_id)]


def key_may_use(api_key, name: str, model_id: str) -> bool:
    """Whether ``name`` is served here (the model ``model_id`` or an alias) and ``api_key`` may use
    it: its allowed models name ``name`` itself or the model that serves it."""
    if name not in served_models(model_id):
        return False
    return api_key.allows_model(name) or api_key.allows_model(model_id)
