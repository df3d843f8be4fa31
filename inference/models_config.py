"""The list of models a process serves: ``MODELS_CONFIG``'s TOML file, read and checked whole.

One ``[[models]]`` table per model::

    [[models]]
    id = "smollm2-135m-instruct"      # the name clients send, usage is counted under (required)
    path = "embedded"                  # a GGUF file, a model folder, or "embedded" (required)
    aliases = ["gpt-3.5-turbo-instruct"]
    weights = "auto"                   # the linear layers' format (MODEL_WEIGHTS's choices)
    context_length = 2048              # positions served, prompt and completion (0: the model's own)
    max_batch_size = 16                # rows of the running batch (ENGINE_MAX_BATCH_SIZE)
    prefill_chunk = 256                # prompt tokens per prefill pass (ENGINE_PREFILL_CHUNK)
    kv_cache_mb = 128                  # the KV cache's budget for stored prompts (ENGINE_PREFIX_CACHE_MB)

A key left out takes the process's setting named beside it (:class:`ModelDefaults`).  A relative
``path`` is read from the file's folder.  Every error is a :class:`ModelsConfigError` naming the
file, the table (``[[models]] #2 ("big")``) and the key, raised before any model loads.

Read with the standard library's ``tomllib``; no Django, no torch (the system checks and the
settings' readers call it at every start).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EMBEDDED = "embedded"
# inference.weights.WEIGHTS_CHOICES, named here so that reading the file needs no torch (a test checks both agree).
WEIGHT_FORMATS = ("auto", "float32", "bfloat16", "int8", "int4", "q4_1", "q8_0")
# A model id or alias: what a URL path segment, a comma-separated allowed_models list and a
# usage record's 200 characters all take.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}")
KEYS = ("id", "path", "aliases", "weights", "context_length", "max_batch_size", "prefill_chunk", "kv_cache_mb")


class ModelsConfigError(ValueError):
    """``MODELS_CONFIG`` cannot be served; the message names the file, the table and the key."""


@dataclass(frozen=True)
class ModelDefaults:
    """What a model table leaves out: the process's ``MODEL_WEIGHTS``, ``ENGINE_MAX_BATCH_SIZE``,
    ``ENGINE_PREFILL_CHUNK`` and ``ENGINE_PREFIX_CACHE_MB``."""

    weights: str = "auto"
    max_batch_size: int = 32
    prefill_chunk: int = 256
    kv_cache_mb: int = 128


@dataclass(frozen=True)
class ModelSpec:
    """One served model: ``id`` and its ``aliases`` (the names it answers to), where it comes from
    (``path``: a file or folder, ``""`` for the embedded GGUF, or for a single-model deployment's
    ``MODEL_PATH`` a hub id) and its engine's knobs (see the module docstring)."""

    id: str
    path: str
    aliases: tuple[str, ...] = ()
    weights: str = "auto"
    context_length: int = 0
    max_batch_size: int = 32
    prefill_chunk: int = 256
    kv_cache_mb: int = 128
    table: str = field(default="", compare=False)  # where it was read, for messages: '[[models]] #1 ("small")'

    @property
    def names(self) -> tuple[str, ...]:
        """The id, then the aliases, in order (:func:`model_names`)."""
        return model_names(self.id, self.aliases)


def model_names(model_id: str, aliases: tuple[str, ...]) -> tuple[str, ...]:
    """The names a model answers to: ``model_id``, then each alias once, in order (an alias equal to
    the id or repeated is harmless, as ``MODEL_ALIASES=a,a`` always was)."""
    return tuple(dict.fromkeys((model_id, *aliases)))


def read_models_config(path: str | Path, defaults: ModelDefaults | None = None) -> list[ModelSpec]:
    """The models of the TOML file at ``path``, in the file's order; raises :class:`ModelsConfigError`."""
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelsConfigError(f"MODELS_CONFIG {file}: cannot be read: {error}") from None
    return parse_models_config(text, str(file), defaults or ModelDefaults(), file.parent)


def parse_models_config(text: str, source: str, defaults: ModelDefaults, base: Path) -> list[ModelSpec]:
    """The models of ``text`` (read from ``source``; relative paths from ``base``); raises
    :class:`ModelsConfigError` for invalid TOML, a missing or unknown key, a value of the wrong
    kind, a path that is not there, or a name given twice."""
    where = f"MODELS_CONFIG {source}"
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ModelsConfigError(f"{where}: not valid TOML: {error}") from None
    extra = sorted(set(document) - {"models"})
    if extra:
        raise ModelsConfigError(f'{where}: unknown key "{extra[0]}" at the top; the file holds [[models]] tables only')
    tables = document.get("models")
    if not isinstance(tables, list) or not tables:
        raise ModelsConfigError(f'{where}: no [[models]] table; list each model in one, with "id" and "path"')
    specs: list[ModelSpec] = []
    owners: dict[str, str] = {}  # a name -> the table that gave it
    for index, table in enumerate(tables, start=1):
        spec = _spec(table, f"{where}: [[models]] #{index}", defaults, base)
        for name in spec.names:
            if name in owners:
                raise ModelsConfigError(f'{spec.table}: "{name}" already names the model of {owners[name]}')
            owners[name] = spec.table.removeprefix(f"{where}: ")
        specs.append(spec)
    return specs


def _spec(table: Any, where: str, defaults: ModelDefaults, base: Path) -> ModelSpec:
    if not isinstance(table, dict):
        raise ModelsConfigError(f"{where}: not a table; write each model as a [[models]] table")
    model_id = table.get("id")
    if isinstance(model_id, str) and model_id:
        where = f'{where} ("{model_id}")'
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ModelsConfigError(f'{where}: unknown key "{unknown[0]}"; the keys are {", ".join(KEYS)}')
    for required in ("id", "path"):
        if required not in table:
            raise ModelsConfigError(f'{where}: key "{required}" is missing')
    model_id = _name(table["id"], where, "id")
    aliases = table.get("aliases", [])
    if not isinstance(aliases, list):
        raise ModelsConfigError(f'{where}, key "aliases": expected a list of names, got {_shown(aliases)}')
    weights = table.get("weights", defaults.weights)
    if weights not in WEIGHT_FORMATS:
        raise ModelsConfigError(
            f'{where}, key "weights": expected one of {", ".join(WEIGHT_FORMATS)}, got {_shown(weights)}'
        )
    return ModelSpec(
        id=model_id,
        path=_path(table["path"], where, base),
        aliases=tuple(_name(alias, where, "aliases") for alias in aliases),
        weights=weights,
        context_length=_integer(table, "context_length", 0, where, least=0),
        max_batch_size=_integer(table, "max_batch_size", defaults.max_batch_size, where, least=1),
        prefill_chunk=_integer(table, "prefill_chunk", defaults.prefill_chunk, where, least=1),
        kv_cache_mb=_integer(table, "kv_cache_mb", defaults.kv_cache_mb, where, least=0),
        table=where,
    )


def _name(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ModelsConfigError(
            f'{where}, key "{key}": {_shown(value)} is not a model name (letters, digits and . _ : @ + -, '
            "starting with a letter or digit, at most 200)"
        )
    return value


def _path(value: Any, where: str, base: Path) -> str:
    """``""`` for the embedded model, else the absolute path of an existing file or folder."""
    if not isinstance(value, str) or not value:
        raise ModelsConfigError(f'{where}, key "path": expected a file, a folder or "{EMBEDDED}", got {_shown(value)}')
    if value == EMBEDDED:
        return ""
    path = Path(value).expanduser()
    path = path if path.is_absolute() else (base / path).absolute()  # base is relative where MODELS_CONFIG is
    if not path.exists():
        raise ModelsConfigError(f'{where}, key "path": {path} does not exist')
    return str(path)


def _integer(table: dict[str, Any], key: str, default: int, where: str, *, least: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive integer" if least else "an integer of 0 or more"
        raise ModelsConfigError(f'{where}, key "{key}": expected {kind}, got {_shown(value)}')
    return value


def _shown(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*", re.IGNORECASE)
_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(text: str) -> int:
    """Bytes of a size: ``"8GiB"`` or ``"8Gi"`` (binary), ``"8GB"`` or ``"8G"`` (decimal), ``"512MiB"``,
    or a plain number of bytes; ``""`` is 0 (no budget), and so is a size written as zero.  Raises
    ``ValueError`` for anything else, a size of less than a byte too (it would read as no budget)."""
    if not text.strip():
        return 0
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size: write e.g. 8GiB, 512MiB, 8GB or a number of bytes")
    number, unit = float(match[1]), (match[2] or "B").upper()
    base = 1024 if "I" in unit else 1000
    size = int(number * base ** _POWERS[unit[0]]) if unit != "B" else int(number)
    if number and not size:
        raise ValueError(f"{text!r} is less than a byte: write e.g. 8GiB, 512MiB, 8GB or a number of bytes")
    return size


def format_size(size: int) -> str:
    """``size`` bytes in GiB or MiB, for messages: ``"6.50 GiB"``, ``"300 MiB"``."""
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"
