"""The Qwen2 (2.5) and Qwen3 families: Llama's decoder layer with biases on q/k/v (Qwen2; read
where the checkpoint has them) or an RMSNorm of each query and key head before the rotary
embeddings (Qwen3's ``q_norm``/``k_norm``, GGUF ``blk.N.attn_q_norm.weight``), and a sliding
window on the layers from ``max_window_layers`` on where ``use_sliding_window`` asks for it.

Their GGUF files (architectures ``qwen2``, ``qwen3``) keep transformers' q/k row order: llama.cpp's
``Qwen2Model`` converter does not permute them as its ``LlamaModel`` does.  Everything else, the
metadata keys (``qwen2.*`` as ``llama.*``) and tensor names, is Llama's
(:mod:`inference.families.llama`).
"""

from __future__ import annotations

from transformers import Qwen2Config, Qwen3Config

from .family import Family, register

QWEN2 = register(Family("qwen2", ("qwen2",), ("qwen2",), Qwen2Config))
QWEN3 = register(Family("qwen3", ("qwen3",), ("qwen3",), Qwen3Config, qk_norm=True))
