"""The Gemma 2 and Gemma 3 families (text models): Llama's decoder layer with

- the embeddings multiplied by ``sqrt(hidden_size)``;
- RMSNorms computing ``x * (1 + w)`` (transformers' ``Gemma2RMSNorm``): the loader adds the 1, as
  llama.cpp's converter does when it writes the GGUF file (``norm.weight`` tensors hold ``w + 1``);
- four norms per layer: the attention's input, its output (transformers' ``post_attention_layernorm``,
  GGUF ``post_attention_norm``: before the residual add), the MLP's input (``pre_feedforward_layernorm``,
  GGUF ``ffn_norm``) and its output (``post_feedforward_layernorm``, GGUF ``post_ffw_norm``);
- GeGLU: ``gelu_tanh(gate) * up``;
- attention scores scaled by ``query_pre_attn_scalar ** -0.5``;
- Gemma 2: attention scores soft-capped (``tanh(s / cap) * cap``, ``attn_logit_softcapping``) and
  the final logits too (``final_logit_softcapping``); sliding-window (local) and global layers
  alternate, the first local;
- Gemma 3: per-head q/k RMSNorms (the ``1 + w`` form too), five local layers to one global, the
  local layers' rotary base ``rope_local_base_freq`` (10000) against the global ``rope_theta``
  (1e6) with the global layers' linear scaling where set (transformers' per-layer-type
  ``rope_parameters``); no attention soft-capping; final soft-capping where set.

The GGUF files (architectures ``gemma2``, ``gemma3``; ``convert_hf_to_gguf``'s ``Gemma2Model``,
``Gemma3Model``) keep transformers' q/k row order and tie the output layer to the embeddings.  They
do not store the layer pattern or ``query_pre_attn_scalar``, older ones not the local rotary base
(``gemma3.rope.freq_base_swa``): llama.cpp's loader (``llama_model::load_hparams``) fixes the first
and the default of the last per architecture and takes the attention scale from the head size, or
from ``hidden_size / heads`` for the 27B models (46 and 62 layers), and so does :func:`gguf_config`;
so too for a key a file may lack: Gemma 2's soft-caps (50 and 30), Gemma 3's window (none: no local
layer).
"""

from __future__ import annotations

from typing import Any

from transformers import Gemma2Config, Gemma3TextConfig

from .family import Family, register

LOCAL_ROPE_BASE = 10000.0  # Gemma 3's local layers' rotary base (llama.cpp: rope_freq_base_train_swa)
# Gemma 2's soft-caps where a file lacks their keys: llama.cpp's defaults (llama_hparams), Gemma2Config's too.
GEMMA2_SOFTCAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
# Layer counts of the 27B models, whose attention scale is hidden_size / heads (llama.cpp's LLM_TYPE_27B).
LAYERS_27B = {"gemma2": 46, "gemma3": 62}


def gguf_config(file, arch: str) -> dict[str, Any]:
    """The Gemma config arguments of a GGUF file of architecture ``arch`` (``gemma2``/``gemma3``)
    beyond the ones every family shares: soft-caps, the attention scale, Gemma 3's rotary bases."""
    heads = int(file.require(f"{arch}.attention.head_count"))
    hidden = int(file.require(f"{arch}.embedding_length"))
    layers = int(file.require(f"{arch}.block_count"))
    head_dim = int(file.get(f"{arch}.attention.key_length") or hidden // heads)
    defaults = GEMMA2_SOFTCAPS if arch == "gemma2" else {}
    result: dict[str, Any] = {
        "query_pre_attn_scalar": hidden // heads if layers == LAYERS_27B[arch] else head_dim,
        **{
            name: file.get(f"{arch}.{name}", defaults.get(name))
            for name in ("final_logit_softcapping", "attn_logit_softcapping")
        },
    }
    if arch == "gemma3":
        full: dict[str, Any] = {"rope_type": "default", "rope_theta": float(file.get(f"{arch}.rope.freq_base", 1e6))}
        if file.get(f"{arch}.rope.scaling.type") == "linear":
            full = {**full, "rope_type": "linear", "factor": float(file.require(f"{arch}.rope.scaling.factor"))}
        local = float(file.get(f"{arch}.rope.freq_base_swa", LOCAL_ROPE_BASE))
        result["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }
        if not file.get(f"{arch}.attention.sliding_window"):
            # llama.cpp runs such a file (sliding_window_pattern 1 in its config) with no local layer.
            result["layer_types"] = ["full_attention"] * layers
    return result


GEMMA2 = register(
    Family(
        "gemma2", ("gemma2",), ("gemma2",), Gemma2Config,
        norm_offset=1.0, activation="gelu_pytorch_tanh", embedding_scale=True, sandwich_norms=True,
        gguf_config=gguf_config,
    )
)  # fmt: skip
GEMMA3 = register(
    Family(
        "gemma3", ("gemma3",), ("gemma3_text",), Gemma3TextConfig, qk_norm=True,
        norm_offset=1.0, activation="gelu_pytorch_tanh", embedding_scale=True, sandwich_norms=True,
        gguf_config=gguf_config,
    )
)  # fmt: skip
