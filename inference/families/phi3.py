"""The Phi-3 family (Phi-3-mini, Phi-3.5-mini): Llama's decoder layer with q/k/v stored as one
matrix and gate/up as another (transformers ``qkv_proj``/``gate_up_proj``; GGUF architecture
``phi3``: ``blk.N.attn_qkv.weight``, and ``blk.N.ffn_up.weight`` holding the gate's rows then the
up projection's, no ``ffn_gate``), q/k rows in transformers' order (llama.cpp's ``Phi3MiniModel``
converter does not permute them), and a sliding window where the config sets one (Phi-3-mini-4k:
2047 positions).

Longrope (``rope_type`` ``longrope``, also written ``su``; in GGUF the tensors
``rope_factors_short.weight``/``rope_factors_long.weight`` and the keys
``phi3.rope.scaling.original_context_length``/``attn_factor``) divides each inverse frequency by a
short factor while a sequence is within ``original_max_position_embeddings`` and by a long factor
beyond it, for the whole sequence (transformers' rule).  A cache of keys rotated with the short
factors is then wrong for a longer sequence, so the runner serves such a model with the short
factors and a context of ``original_max_position_embeddings`` (:func:`~.llama.served_context`):
its logits are transformers' for every sequence it accepts, and a longer prompt is refused.  The
Phi-4-mini shape (partial rotary embeddings) is not run here: it stays on transformers' modeling.
"""

from __future__ import annotations

from transformers import Phi3Config

from .family import Family, register

PHI3 = register(Family("phi3", ("phi3",), ("phi3",), Phi3Config, fused_qkv=True, fused_gate_up=True))
