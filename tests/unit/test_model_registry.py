"""The process's models: each name (an id or an alias) names one engine; a bad ``MODELS_CONFIG`` or
budget stops a start with its reason (system checks E012 and E013, the memory budget at start-up)."""

from __future__ import annotations

import time

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from inference.registry import ModelRegistry, ServedModel


class FakeEngine:
    """Stands in for an engine: its model id, readiness, and how it was stopped."""

    def __init__(self, model_id: str, ready: bool = True, stop_seconds: float = 0.0) -> None:
        self.model_id, self.ready, self.stop_seconds = model_id, ready, stop_seconds
        self.started = False
        self.stops: list[float] = []

    def start(self) -> None:
        self.started = True

    def stop(self, timeout: float = 30) -> None:
        self.stops.append(timeout)
        time.sleep(min(timeout, self.stop_seconds))


def registry(*engines: FakeEngine, aliases: dict[str, tuple[str, ...]] | None = None) -> ModelRegistry:
    aliases = aliases or {}
    return ModelRegistry(ServedModel(engine, aliases.get(engine.model_id, ())) for engine in engines)  # type: ignore[arg-type]


def test_every_id_and_alias_names_its_own_engine():
    small, big = FakeEngine("small"), FakeEngine("big")
    models = registry(small, big, aliases={"big": ("gpt-4o-mini", "big")})

    assert models.resolve("small").engine is small
    assert models.resolve("gpt-4o-mini").engine is big and models.resolve("gpt-4o-mini").id == "big"
    assert models.resolve("gpt-4") is None
    assert [model.names for model in models] == [("small",), ("big", "gpt-4o-mini")]  # the id once, first
    assert models.default.engine is small and len(models) == 2


def test_a_name_given_to_two_models_is_refused():
    with pytest.raises(ValueError, match="'small' names both 'small' and 'big'"):
        registry(FakeEngine("small"), FakeEngine("big"), aliases={"big": ("small",)})


def test_an_alias_given_twice_to_one_model_names_it_once():
    # MODEL_ALIASES=gpt-x,gpt-x served before there could be several models; it must still start.
    models = registry(FakeEngine("small"), aliases={"small": ("gpt-x", "small", "gpt-x")})

    assert models.default.names == ("small", "gpt-x")
    assert models.resolve("gpt-x") is models.default


def test_the_registry_is_ready_once_every_engine_is():
    assert not registry(FakeEngine("small"), FakeEngine("big", ready=False)).ready
    assert registry(FakeEngine("small"), FakeEngine("big")).ready


def test_start_starts_every_engine():
    small, big = FakeEngine("small"), FakeEngine("big")
    registry(small, big).start()

    assert small.started and big.started


def test_stop_tells_every_engine_first_then_waits_for_all_within_one_timeout():
    slow, quick = FakeEngine("slow", stop_seconds=60), FakeEngine("quick")
    started = time.monotonic()

    registry(slow, quick).stop(timeout=0.3)

    assert time.monotonic() - started < 0.3 + 0.2
    assert slow.stops[0] == quick.stops[0] == 0  # both told before either is waited for
    assert slow.stops[1] <= 0.3 and quick.stops[1] <= 0.3


# --- The settings: MODELS_CONFIG's system check, MODELS_MEMORY_BUDGET's, and the budget at start ----


def errors(tag_id: str) -> list[checks.CheckMessage]:
    return [message for message in checks.run_checks() if message.id == tag_id]


def test_an_invalid_models_config_fails_the_system_check_naming_the_table_and_key(settings, tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[[models]]\nid = "small"\npath = "embedded"\nmax_batch = 4\n')
    settings.MODELS_CONFIG = str(path)

    (error,) = errors("completions_site.E012")

    assert '[[models]] #1 ("small"): unknown key "max_batch"' in error.msg
    assert "docs/configuration.md#several-models" in error.hint


def test_a_valid_models_config_passes_the_system_check(settings, tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[[models]]\nid = "small"\npath = "embedded"\n')
    settings.MODELS_CONFIG = str(path)

    assert errors("completions_site.E012") == []


def test_a_memory_budget_that_is_no_size_fails_the_system_check(settings):
    settings.MODELS_MEMORY_BUDGET = "twelve gigs"

    (error,) = errors("completions_site.E013")

    assert "MODELS_MEMORY_BUDGET" in error.msg and "12GiB" in error.hint


def test_without_models_config_the_model_settings_make_the_one_model(settings):
    from api.engine import model_specs

    settings.MODELS_CONFIG = ""
    settings.MODEL_ID, settings.MODEL_PATH, settings.MODEL_ALIASES = "solo", "/models/solo.gguf", ["gpt-4o-mini"]
    settings.ENGINE_MAX_BATCH_SIZE, settings.ENGINE_PREFIX_CACHE_MB = 12, 64

    (spec,) = model_specs()

    assert (spec.id, spec.path, spec.aliases) == ("solo", "/models/solo.gguf", ("gpt-4o-mini",))
    assert (spec.max_batch_size, spec.kv_cache_mb, spec.context_length) == (12, 64, 0)


def test_each_models_table_makes_its_engines_configuration(settings, tmp_path):
    from api.engine import engine_configs, model_specs

    path = tmp_path / "models.toml"
    path.write_text(
        '[[models]]\nid = "small"\npath = "embedded"\n'
        '[[models]]\nid = "big"\npath = "embedded"\nweights = "float32"\ncontext_length = 512\n'
        "max_batch_size = 4\nprefill_chunk = 64\nkv_cache_mb = 16\n"
    )
    settings.MODELS_CONFIG, settings.ENGINE_MAX_BATCH_SIZE, settings.MODEL_WEIGHTS = str(path), 32, "auto"

    small, big = (engine_configs(spec) for spec in model_specs())

    assert (small[0].model_id, small[0].path, small[0].weights, small[1].max_batch_size) == ("small", "", "auto", 32)
    assert (big[0].model_id, big[0].weights) == ("big", "float32")
    assert (big[1].max_batch_size, big[1].prefill_chunk, big[1].prefix_cache_mb, big[1].max_context) == (4, 64, 16, 512)


def test_models_past_the_memory_budget_refuse_the_start_naming_the_budget(settings, tmp_path):
    from completions_site.startup import check_models_fit

    path = tmp_path / "models.toml"
    path.write_text(
        '[[models]]\nid = "small"\npath = "embedded"\ncontext_length = 1024\nmax_batch_size = 2\n'
        '[[models]]\nid = "big"\npath = "embedded"\nweights = "float32"\nmax_batch_size = 8\n'
    )
    settings.MODELS_CONFIG, settings.MODELS_MEMORY_BUDGET = str(path), "1GiB"

    with pytest.raises(ImproperlyConfigured) as refused:
        check_models_fit()

    message = str(refused.value)
    assert message.startswith('Refusing to start: The model "big" does not fit in MODELS_MEMORY_BUDGET=1GiB (1.00 GiB)')
    assert '"small": 92 MiB of weights + 128 MiB of KV cache (2 rows of 1024 positions)' in message


def test_a_model_whose_file_cannot_be_estimated_refuses_the_start_naming_it(settings, tmp_path):
    from completions_site.startup import check_models_fit

    (tmp_path / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    path = tmp_path / "models.toml"
    path.write_text('[[models]]\nid = "small"\npath = "embedded"\n[[models]]\nid = "broken"\npath = "broken.gguf"\n')
    settings.MODELS_CONFIG, settings.MODELS_MEMORY_BUDGET = str(path), "8GiB"

    with pytest.raises(ImproperlyConfigured, match='^Refusing to start: The model "broken" cannot be estimated from'):
        check_models_fit()


def test_models_within_the_budget_start_and_log_their_estimates(settings, tmp_path, caplog):
    import logging

    from completions_site.startup import check_models_fit

    path = tmp_path / "models.toml"
    path.write_text('[[models]]\nid = "small"\npath = "embedded"\ncontext_length = 1024\nmax_batch_size = 2\n')
    settings.MODELS_CONFIG, settings.MODELS_MEMORY_BUDGET = str(path), "1GiB"

    with caplog.at_level(logging.INFO, logger="completions_site.startup"):
        check_models_fit()

    assert 'Memory: "small": 92 MiB of weights' in caplog.text
