"""What a model family tells the shared runner, and the registry of the families it runs.

A :class:`Family` names the checkpoints it reads (GGUF ``general.architecture`` values, transformers
``model_type`` values) and how they differ from Llama's decoder layer.  Differences that are data in
the checkpoint itself are read where present, for every family: q/k/v biases (Qwen2's), the sliding
window of each layer (:func:`layer_windows`: Mistral's, Qwen2's when enabled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PretrainedConfig


@dataclass(frozen=True)
class Family:
    """One family of decoder-only models the runner runs (llama.cpp's ``llm_arch`` table row).

    ``config_class``: the transformers config a GGUF file's metadata becomes.  ``permuted_qk``:
    llama.cpp's converter interleaved each head's rotary halves in the GGUF's q/k rows (its
    ``LlamaModel.permute``, architecture ``llama`` only).  ``qk_norm``: an RMSNorm of each query
    and key head (``[head_dim]`` scales) before the rotary embeddings (Qwen3, Gemma 3).  ``fused_qkv``,
    ``fused_gate_up``: the checkpoint stores q/k/v as one matrix (transformers ``qkv_proj``, GGUF
    ``attn_qkv``) and gate/up as one (``gate_up_proj``, GGUF ``ffn_up`` holding gate then up rows),
    as Phi-3 does.

    Gemma's differences: ``norm_offset``, what transformers' RMSNorms add to their stored scales
    (``x * (1 + w)``; the loader adds it, so the runner multiplies by the scale as it is; a GGUF
    file stores ``w + 1`` already, as llama.cpp's converter writes it).  ``activation``: the MLP's
    gate activation, transformers' ``hidden_act``/``hidden_activation`` name (``silu``: SwiGLU;
    ``gelu_pytorch_tanh``: GeGLU).  ``embedding_scale``: the embeddings are multiplied by
    ``sqrt(hidden_size)``.  ``sandwich_norms``: an RMSNorm of the attention's and of the MLP's
    output before each is added to the residual stream (GGUF ``post_attention_norm``,
    ``post_ffw_norm``; the MLP's input norm is then transformers' ``pre_feedforward_layernorm``).
    ``gguf_config``: the family's own transformers config arguments from a GGUF file's metadata
    (``(file, architecture) -> dict``), over the ones every family shares."""

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    config_class: Callable[..., PretrainedConfig]  # a transformers config class, called with its fields
    permuted_qk: bool = False
    qk_norm: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    norm_offset: float = 0.0
    activation: str = "silu"
    embedding_scale: bool = False
    sandwich_norms: bool = False
    gguf_config: Callable[[Any, str], dict[str, Any]] | None = None


_FAMILIES: list[Family] = []


def register(family: Family) -> Family:
    """Add ``family`` to the registry (each family module at import); returns it."""
    _FAMILIES.append(family)
    return family


def families() -> tuple[Family, ...]:
    return tuple(_FAMILIES)


def for_architecture(architecture: str | None) -> Family | None:
    """The family reading GGUF files of ``architecture``, or None."""
    return next((family for family in _FAMILIES if architecture in family.architectures), None)


def for_model_type(model_type: str | None) -> Family | None:
    """The family running transformers models of ``model_type``, or None."""
    return next((family for family in _FAMILIES if model_type in family.model_types), None)


def architectures() -> tuple[str, ...]:
    return tuple(name for family in _FAMILIES for name in family.architectures)


def model_types() -> tuple[str, ...]:
    return tuple(name for family in _FAMILIES for name in family.model_types)


def layer_windows(config) -> list[int | None]:
    """Per layer, how many positions a query attends to (itself and those before it), or None for
    every earlier one: transformers' ``layer_types`` where the config has them (Qwen2/3 with
    ``use_sliding_window``: the layers from ``max_window_layers`` on), else ``sliding_window`` for
    every layer (Mistral; transformers' ``sliding_window_overlay``: ``kv > q - window``).  A window
    as long as the context is none."""
    layers = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None) or None
    if window is None or window >= int(config.max_position_embeddings):
        return [None] * layers
    types = getattr(config, "layer_types", None)
    if types is None:
        return [int(window)] * layers
    return [int(window) if kind == "sliding_attention" else None for kind in types]
