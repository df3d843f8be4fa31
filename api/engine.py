"""The process's models and their engines, built once from Django settings.

``inference`` knows nothing of Django: it takes a :class:`~inference.models_config.ModelSpec` per
model, a :class:`~inference.model_loader.ModelConfig` and an :class:`~inference.engine.EngineConfig`
per engine.  This module reads the settings into those objects: ``MODELS_CONFIG``'s list of models
(:mod:`inference.models_config`) when it is set, else the one model of ``MODEL_*``, each engine's
knobs from ``ENGINE_*`` where its table leaves them out (see ``completions_site/settings.py``).  It
makes the :class:`~inference.registry.ModelRegistry` a server process serves (kept by
:mod:`inference.process`) and answers which names a key may use.  Torch is imported on the first
engine made, not at import time, so that the views and the management commands load without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

from inference import process
from inference.models_config import ModelDefaults, ModelSpec, parse_size, read_models_config
from inference.registry import ModelRegistry, ServedModel

if TYPE_CHECKING:
    from inference.engine import EngineConfig
    from inference.footprint import Footprint
    from inference.model_loader import ModelConfig


def model_specs() -> list[ModelSpec]:
    """The models this process serves, in order: ``MODELS_CONFIG``'s, or the one of ``MODEL_*``.

    Raises :class:`~inference.models_config.ModelsConfigError` for a file that cannot be served
    (the system check ``completions_site.E012`` reports the same before a start)."""
    if settings.MODELS_CONFIG:
        return read_models_config(settings.MODELS_CONFIG, _defaults())
    defaults = _defaults()
    return [
        ModelSpec(
            id=settings.MODEL_ID,
            path=settings.MODEL_PATH,
            aliases=tuple(settings.MODEL_ALIASES),
            weights=defaults.weights,
            max_batch_size=defaults.max_batch_size,
            prefill_chunk=defaults.prefill_chunk,
            kv_cache_mb=defaults.kv_cache_mb,
        )
    ]


def _defaults() -> ModelDefaults:
    return ModelDefaults(
        weights=settings.MODEL_WEIGHTS,
        max_batch_size=settings.ENGINE_MAX_BATCH_SIZE,
        prefill_chunk=settings.ENGINE_PREFILL_CHUNK,
        kv_cache_mb=settings.ENGINE_PREFIX_CACHE_MB,
    )


def engine_configs(spec: ModelSpec | None = None) -> tuple[ModelConfig, EngineConfig]:
    """The model's and the engine's configuration of ``spec`` (default: the first model served)."""
    from inference.engine import EngineConfig
    from inference.model_loader import ModelConfig

    spec = spec or model_specs()[0]
    model = ModelConfig(
        path=spec.path,
        model_id=spec.id,
        device=settings.MODEL_DEVICE,
        dtype=settings.MODEL_DTYPE,
        weights=spec.weights,
        cache_dir=settings.MODEL_CACHE_DIR,
    )
    engine = EngineConfig(
        max_batch_size=spec.max_batch_size,
        max_queue=settings.ENGINE_MAX_QUEUE,
        prefill_chunk=spec.prefill_chunk,
        num_threads=settings.ENGINE_NUM_THREADS,
        runner=settings.ENGINE_RUNNER,
        kv_cache_dtype=settings.ENGINE_KV_CACHE_DTYPE,
        prefix_caching=settings.ENGINE_PREFIX_CACHING,
        prefix_cache_mb=spec.kv_cache_mb,
        activation_bits=8 if settings.ENGINE_Q8_ACTIVATIONS else 16,
        k_quant_int8=settings.ENGINE_K_QUANT_Q8_ACTIVATIONS,
        max_context=spec.context_length,
        freeze_gc=True,  # a serving process keeps what it loaded until it exits
        exit_on_load_failure=True,
    )
    return model, engine


def get_models() -> ModelRegistry:
    """The process's models, their engines created on first use (never at import time); not started here."""
    return process.get_or_create(_make_models)


def _make_models() -> ModelRegistry:
    from inference.engine import Engine

    return ModelRegistry(ServedModel(Engine(*engine_configs(spec)), spec.aliases) for spec in model_specs())


def footprints() -> list[Footprint]:
    """Each served model's estimated weights and KV cache (:mod:`inference.footprint`), in order."""
    from inference.footprint import estimate

    return [estimate(spec, settings.ENGINE_KV_CACHE_DTYPE) for spec in model_specs()]


def check_memory_budget() -> list[Footprint]:
    """Refuse models that do not fit in ``MODELS_MEMORY_BUDGET`` together (nothing to check without
    one); returns the estimates.  Raises :class:`~inference.footprint.MemoryBudgetExceeded` naming
    the budget and the first model past it, ``ValueError`` for a budget that is no size."""
    from inference.footprint import check_budget

    budget = parse_size(settings.MODELS_MEMORY_BUDGET)
    if not budget:
        return []
    estimates = footprints()
    check_budget(estimates, budget, settings.MODELS_MEMORY_BUDGET)
    return estimates


def key_may_use(api_key, name: str, model: ServedModel) -> bool:
    """Whether ``name`` names ``model`` (its id or an alias) and ``api_key`` may use it: its allowed
    models name ``name`` itself or the model's id."""
    if name not in model.names:
        return False
    return api_key.allows_model(name) or api_key.allows_model(model.id)
