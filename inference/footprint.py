"""What a model will hold in memory once served: its weights and its KV cache, estimated before loading.

``MODELS_MEMORY_BUDGET`` is checked against the sum of these estimates when a process starts
(:func:`check_budget`), so that a list of models that cannot fit together is refused with a message
before anything loads, not by the kernel's OOM killer an hour later.

The estimates are upper bounds of what the engine keeps, from the files' headers alone (a GGUF
file's metadata and tensor records, a folder's ``config.json`` and safetensors headers):

- **weights**: a GGUF file served in its own blocks (``weights = "auto"``, as our runner reads
  them) takes its tensors' bytes; in a named format, its parameters times that format's bytes per
  weight (:data:`BYTES_PER_WEIGHT`).  A folder with ``auto`` counts float32, the widest format
  ``auto`` may pick (``inference.weights.AUTO_FORMATS``): name a format for a closer figure.
- **KV cache**: every row of the batch at the full context, ``max_batch_size * context_length``
  positions of ``layers * kv_heads * head_dim`` keys and as many values, or the prefix cache's
  budget (``kv_cache_mb``) when that is larger: the stored prompts take at most what the running
  rows leave of it (:mod:`inference.prefix_cache`).  Keys and values are 2 bytes (float16, the
  fused decode step's) unless the weights or ``ENGINE_KV_CACHE_DTYPE`` say float32.

Activations, the tokenizer and Python's own memory come on top: leave the budget some room.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from .models_config import ModelSpec, format_size

# Bytes per weight of each format of inference.weights, its scales included (ggml's blocks: Q4_1
# stores 32 weights in 20 bytes, Q8_0 in 34; torch's int4 keeps a scale and a zero per group of 32).
BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.625, "q4_1": 0.625, "q8_0": 1.0625}
KV_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "I32": 4, "I64": 8}


class MemoryBudgetExceeded(ValueError):
    """The models do not fit in ``MODELS_MEMORY_BUDGET``; the message names the budget and each model's share."""


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model: parameters, the bytes of its stored tensors, the KV
    cache's shape per position, and its own context."""

    parameters: int
    stored_bytes: int
    layers: int
    kv_heads: int
    head_dim: int
    context: int


@dataclass(frozen=True)
class Footprint:
    """A model's estimated ``weights`` and ``kv_cache`` bytes (see the module docstring), with the
    ``rows`` and ``context`` positions its KV cache was counted for."""

    model: str
    weights: int
    kv_cache: int
    rows: int
    context: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    def describe(self) -> str:
        """``"small": 95 MiB of weights + 1.41 GiB of KV cache (16 rows of 2048 positions)``."""
        return (
            f'"{self.model}": {format_size(self.weights)} of weights + {format_size(self.kv_cache)} of KV cache '
            f"({self.rows} rows of {self.context} positions)"
        )


def estimate(spec: ModelSpec, kv_cache_dtype: str = "auto") -> Footprint:
    """The footprint of ``spec`` (its file or folder, ``""`` for the embedded GGUF) with the KV
    cache in ``kv_cache_dtype`` (``ENGINE_KV_CACHE_DTYPE``).  Raises ``ValueError`` naming the model
    and why for a file or folder it cannot read."""
    try:
        shape = model_shape(spec.path)
    except (OSError, ValueError) as error:
        raise ValueError(f'The model "{spec.id}" cannot be estimated from its files: {error}') from None
    if spec.weights == "auto":
        weights = shape.stored_bytes if _gguf_of(spec.path) is not None else shape.parameters * 4
    else:
        weights = math.ceil(shape.parameters * BYTES_PER_WEIGHT[spec.weights])
    context = min(shape.context, spec.context_length) if spec.context_length and shape.context else shape.context
    context = context or spec.context_length
    kv_bytes = KV_DTYPE_BYTES.get(kv_cache_dtype, 4 if spec.weights == "float32" else 2)
    per_position = 2 * shape.layers * shape.kv_heads * shape.head_dim * kv_bytes
    kv_cache = max(spec.max_batch_size * context * per_position, spec.kv_cache_mb << 20)
    return Footprint(spec.id, weights, kv_cache, spec.max_batch_size, context)


def check_budget(footprints: list[Footprint], budget: int, budget_text: str) -> None:
    """Raise :class:`MemoryBudgetExceeded` when ``footprints`` together pass ``budget`` bytes
    (``budget_text`` as the operator wrote it), naming the first model that does not fit; 0: no budget."""
    if not budget:
        return
    used = 0
    for footprint in footprints:
        if used + footprint.total > budget:
            shares = "; ".join(f.describe() for f in footprints)
            raise MemoryBudgetExceeded(
                f'The model "{footprint.model}" does not fit in MODELS_MEMORY_BUDGET={budget_text} '
                f"({format_size(budget)}): {format_size(budget - used)} is left of it after the models before it, "
                f"and it needs {format_size(footprint.total)}. Estimates: {shares}. Lower a model's context_length "
                "or max_batch_size, name a smaller weights format, serve fewer models here, or raise the budget."
            )
        used += footprint.total


def model_shape(path: str) -> Shape:
    """The :class:`Shape` of the model at ``path`` (a GGUF file, a folder holding one, a
    transformers folder; ``""`` for the embedded GGUF)."""
    gguf = _gguf_of(path)
    if gguf is not None:
        return _gguf_shape(gguf)
    return _folder_shape(Path(path))


def _gguf_of(path: str) -> Path | None:
    from .model_loader import embedded_gguf_path, gguf_file_of

    return gguf_file_of(path) if path else embedded_gguf_path()


def _gguf_shape(path: Path) -> Shape:
    from .formats.gguf import GGUFFile

    file = GGUFFile(path)
    arch = file.require("general.architecture")

    def key(name: str, default: int = 0) -> int:
        return int(file.get(f"{arch}.{name}", default) or default)

    heads = key("attention.head_count", 1)
    head_dim = key("attention.key_length") or key("embedding_length") // heads
    return Shape(
        parameters=sum(math.prod(tensor.shape) for tensor in file.tensors.values()),
        stored_bytes=sum(tensor.nbytes for tensor in file.tensors.values()),
        layers=key("block_count"),
        kv_heads=key("attention.head_count_kv", heads),
        head_dim=head_dim,
        context=key("context_length"),
    )


def _folder_shape(folder: Path) -> Shape:
    """A transformers folder's shape from ``config.json`` (a multimodal one's ``text_config``) and
    its safetensors headers (else the weight files' sizes, taken as 16-bit weights)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{folder}: no readable config.json: {error}") from None
    config = config.get("text_config", config)
    heads = int(config.get("num_attention_heads", 1))
    head_dim = int(config.get("head_dim") or int(config.get("hidden_size", 0)) // heads)
    parameters = stored = 0
    for file in sorted(folder.glob("*.safetensors")):
        counted, nbytes = _safetensors_counts(file)
        parameters, stored = parameters + counted, stored + nbytes
    if not parameters:
        stored = sum(file.stat().st_size for file in folder.glob("*.bin"))
        parameters = stored // 2
    return Shape(
        parameters=parameters,
        stored_bytes=stored,
        layers=int(config.get("num_hidden_layers", 0)),
        kv_heads=int(config.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        context=int(config.get("max_position_embeddings", 0)),
    )


def _safetensors_counts(file: Path) -> tuple[int, int]:
    """``(parameters, bytes)`` of a safetensors file from its JSON header (no tensor is read).
    Raises ``ValueError`` naming the file when the header is not a safetensors one."""
    try:
        with open(file, "rb") as stream:
            (length,) = struct.unpack("<Q", stream.read(8))
            header = json.loads(stream.read(length))
        parameters = nbytes = 0
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            count = math.prod(tensor["shape"])
            parameters += count
            nbytes += count * _SAFETENSORS_DTYPE_BYTES.get(tensor["dtype"], 2)
    except (struct.error, ValueError, KeyError, TypeError, AttributeError) as error:  # the file's bytes, not ours
        raise ValueError(f"{file}: not a safetensors header ({type(error).__name__}: {error})") from None
    return parameters, nbytes
