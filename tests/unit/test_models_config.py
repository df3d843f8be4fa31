"""``MODELS_CONFIG``: a TOML list of models, read whole and refused with the table and key at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.models_config import (
    WEIGHT_FORMATS,
    ModelDefaults,
    ModelsConfigError,
    ModelSpec,
    format_size,
    parse_size,
    read_models_config,
)

DEFAULTS = ModelDefaults(weights="auto", max_batch_size=32, prefill_chunk=256, kv_cache_mb=128)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "big.gguf").write_bytes(b"GGUF")
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def read(tmp_path: Path, text: str) -> list[ModelSpec]:
    return read_models_config(write(tmp_path, text), DEFAULTS)


def test_every_key_is_read_and_a_left_out_one_takes_the_settings_default(tmp_path):
    small, big = read(
        tmp_path,
        """
        [[models]]
        id = "small"
        path = "embedded"

        [[models]]
        id = "big"
        path = "big.gguf"
        aliases = ["gpt-4o-mini", "big-latest"]
        weights = "q8_0"
        context_length = 2048
        max_batch_size = 8
        prefill_chunk = 128
        kv_cache_mb = 64
        """,
    )

    assert small == ModelSpec(id="small", path="", max_batch_size=32, prefill_chunk=256, kv_cache_mb=128)
    assert big == ModelSpec(
        id="big",
        path=str(tmp_path / "big.gguf"),  # relative to the file's folder
        aliases=("gpt-4o-mini", "big-latest"),
        weights="q8_0",
        context_length=2048,
        max_batch_size=8,
        prefill_chunk=128,
        kv_cache_mb=64,
    )
    assert big.names == ("big", "gpt-4o-mini", "big-latest")


def test_a_folder_by_absolute_path_is_a_model_path(tmp_path):
    folder = tmp_path / "folder-model"
    folder.mkdir()

    (spec,) = read(tmp_path, f'[[models]]\nid = "f"\npath = "{folder}"\n')

    assert spec.path == str(folder)


def test_a_relative_path_in_a_file_named_relatively_is_made_absolute(tmp_path, monkeypatch):
    write(tmp_path, "[[models]]\nid = 'big'\npath = 'big.gguf'\n")
    monkeypatch.chdir(tmp_path)

    (spec,) = read_models_config("models.toml", DEFAULTS)

    assert spec.path == str(tmp_path / "big.gguf")  # the engine's thread or a later chdir cannot move it


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[models]\nid = 'x'", "not valid TOML"),
        ("", "no [[models]] table"),
        ("title = 'x'\n[[models]]\nid = 'a'\npath = 'embedded'", 'unknown key "title" at the top'),
        ("models = [1]", "[[models]] #1: not a table"),
        ("[[models]]\npath = 'embedded'", '[[models]] #1: key "id" is missing'),
        ("[[models]]\nid = 'a'", '[[models]] #1 ("a"): key "path" is missing'),
        ("[[models]]\nid = 'a'\npath = 'embedded'\nbatch = 4", '[[models]] #1 ("a"): unknown key "batch"'),
        ("[[models]]\nid = 'a b'\npath = 'embedded'", 'key "id": "a b" is not a model name'),
        ("[[models]]\nid = 'a'\npath = 'embedded'\naliases = 'b'", 'key "aliases": expected a list'),
        ("[[models]]\nid = 'a'\npath = 'embedded'\naliases = ['b,c']", 'key "aliases": "b,c" is not a model name'),
        ("[[models]]\nid = 'a'\npath = 'missing.gguf'", 'key "path": ' + "{tmp}/missing.gguf does not exist"),
        ("[[models]]\nid = 'a'\npath = ''", 'key "path": expected a file, a folder or "embedded"'),
        ("[[models]]\nid = 'a'\npath = 'embedded'\nweights = 'q2'", 'key "weights": expected one of auto, float32'),
        ("[[models]]\nid = 'a'\npath = 'embedded'\nmax_batch_size = 0", 'key "max_batch_size": expected a positive'),
        ("[[models]]\nid = 'a'\npath = 'embedded'\nprefill_chunk = '8'", 'key "prefill_chunk": expected a positive'),
        ("[[models]]\nid = 'a'\npath = 'embedded'\ncontext_length = true", 'key "context_length": expected an integer'),
        ("[[models]]\nid = 'a'\npath = 'embedded'\nkv_cache_mb = -1", 'key "kv_cache_mb": expected an integer of 0'),
    ],
    ids=lambda value: value if len(value) < 30 else None,
)
def test_an_invalid_file_is_refused_naming_the_table_and_the_key(tmp_path, text, message):
    with pytest.raises(ModelsConfigError) as refused:
        read(tmp_path, text)

    assert message.format(tmp=tmp_path) in str(refused.value)
    assert str(refused.value).startswith(f"MODELS_CONFIG {tmp_path / 'models.toml'}: ")


def test_a_name_given_twice_is_refused_naming_both_tables(tmp_path):
    text = "[[models]]\nid = 'a'\npath = 'embedded'\n[[models]]\nid = 'b'\npath = 'embedded'\naliases = ['a']\n"

    with pytest.raises(ModelsConfigError, match=r'\[\[models\]\] #2 \("b"\): "a" already names the model of '):
        read(tmp_path, text)


def test_an_alias_given_twice_in_one_table_is_one_name(tmp_path):
    (spec,) = read(tmp_path, "[[models]]\nid = 'a'\npath = 'embedded'\naliases = ['b', 'a', 'b']\n")

    assert spec.names == ("a", "b")


def test_a_missing_file_is_refused_by_its_name(tmp_path):
    with pytest.raises(ModelsConfigError, match="models.toml: cannot be read"):
        read_models_config(tmp_path / "models.toml")


def test_the_weight_formats_are_those_the_engine_takes():
    from inference.weights import WEIGHTS_CHOICES

    assert WEIGHT_FORMATS == WEIGHTS_CHOICES


@pytest.mark.parametrize(
    "text, size",
    [
        ("", 0),
        ("1048576", 1 << 20),
        ("8GiB", 8 << 30),
        ("8Gi", 8 << 30),
        ("512 MiB", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("8GB", 8 * 10**9),
        ("8g", 8 * 10**9),
        ("100K", 100_000),
        ("2TiB", 2 << 40),
    ],
)
def test_a_memory_budget_reads_binary_and_decimal_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["8 gigabytes", "-1G", "G", "1.2.3M"])
def test_a_memory_budget_that_is_no_size_is_refused(text):
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["0.5", "0.0001KiB"])
def test_a_memory_budget_under_a_byte_is_refused_not_read_as_none(text):
    with pytest.raises(ValueError, match="less than a byte"):
        parse_size(text)
    assert parse_size("0") == parse_size("0GiB") == 0  # written as zero: no budget, as empty


def test_sizes_are_written_in_mebibytes_or_gibibytes():
    assert (format_size(300 << 20), format_size(13 << 29)) == ("300 MiB", "6.50 GiB")
