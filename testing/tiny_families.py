"""Tiny random models of each family the runner takes, and the GGUF files llama.cpp would write of them.

Each family's tiny config keeps its real model's shape ratios (query heads per KV head, head size
against the hidden size, MLP width, tied embeddings, rope base, norm epsilon) at a hidden size of
128-448 and 2 layers.  :func:`write_gguf` writes a model with gguf-py's writer as llama.cpp's
converter does (its architecture's metadata keys, ggml's tensor names, q/k rows permuted for
``llama`` only) and returns what each tensor holds as stored; :func:`stored_reference` is the
transformers model on those (dequantized) weights, the reference of a block format's logits.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from inference.families import llama as family
from inference.formats import ggml

VOCAB = 96
PHI3_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}  # Phi3Config's defaults lie past VOCAB
# name -> (model class, config class, config, GGUF architecture)
FAMILIES = {
    # SmolLM2 / Llama 3.2-1B: 2 query heads per KV head (here 4 / 2), head size 16, untied.
    "llama": (LlamaForCausalLM, LlamaConfig, {
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    }, "llama"),
    # Qwen2.5-0.5B: 14 / 2 heads of 64 (here 7 / 1), MLP 5.4 times the hidden size, q/k/v biases, tied.
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, {
        "hidden_size": 448, "intermediate_size": 2432, "num_attention_heads": 7, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    }, "qwen2"),
    # Qwen3-0.6B: 16 / 8 heads of 128, heads * head_dim twice the hidden size (here 4 / 2 of 64 over
    # 128), MLP 3 times, q/k norms, tied.
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, {
        "hidden_size": 128, "intermediate_size": 384, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    }, "qwen3"),
    # Mistral-7B-v0.1: 32 / 8 heads of 128 (here 4 / 1 of 64), MLP 3.5 times, untied, a sliding window
    # of 4096 of 32768 positions (here 8 of 256, so that tests pass it).
    "mistral": (MistralForCausalLM, MistralConfig, {
        "hidden_size": 256, "intermediate_size": 896, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": 8, **PHI3_TOKENS,
    }, "llama"),
    # Phi-3-mini-4k: 32 / 32 heads of 96 (here 2 / 2), MLP 2.7 times, untied, fused qkv and gate/up,
    # a sliding window of 2047 of 4096 positions (here 8 of 256).
    "phi3": (Phi3ForCausalLM, Phi3Config, {
        "hidden_size": 192, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": 8, **PHI3_TOKENS,
    }, "phi3"),
    # Phi-3.5-mini (Phi-3-mini-128k): the same shape with longrope, short and long factors per
    # frequency, 4096 of 131072 positions pretrained (here 64 of 256).
    "phi3-longrope": (Phi3ForCausalLM, Phi3Config, {
        "hidden_size": 192, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "original_max_position_embeddings": 64, **PHI3_TOKENS,
        "rope_parameters": {
            "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0 + 0.05 * i for i in range(48)], "long_factor": [1.0 + 0.5 * i for i in range(48)],
        },
    }, "phi3"),
    # Gemma-2-2B: 8 / 4 heads of 256, heads * head_dim 0.89 of the hidden size (here 4 / 2 of 64 over
    # 288), MLP 4 times, attention scale head_dim ** -0.5, soft-caps 50 and 30, local layers (window
    # 4096 of 8192, here 6 of 256) alternating with global ones from the first, tied.
    "gemma2": (Gemma2ForCausalLM, Gemma2Config, {
        "hidden_size": 288, "intermediate_size": 1152, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "query_pre_attn_scalar": 64, "rms_norm_eps": 1e-6, "sliding_window": 6,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
    }, "gemma2"),
    # Gemma-3-1B: 4 / 1 heads of 256 (here of 64 over 288), MLP 6 times, q/k norms, five local layers
    # (window 512, here 6) to one global (so 6 layers here), rope bases 1e4 local and 1e6 global with
    # Gemma-3-4B's linear scaling (factor 8) on the global layers, tied.
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, {
        "hidden_size": 288, "intermediate_size": 1728, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 64, "query_pre_attn_scalar": 64, "rms_norm_eps": 1e-6, "sliding_window": 6,
        "num_hidden_layers": 6, "tie_word_embeddings": True,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }, "gemma3"),
}  # fmt: skip
# Gemma's layer norms under GGUF names (transformers' post_attention_layernorm is the attention's
# output norm there, not the MLP's input norm as in Llama).
GEMMA_NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
# What each architecture's converter adds to a norm's scales (Gemma's x * (1 + w) stored as w + 1).
NORM_OFFSETS = {"gemma2": 1.0, "gemma3": 1.0}
LAYERS = 2


def architecture(name: str) -> str:
    """The GGUF architecture llama.cpp's converter writes family ``name`` as."""
    return FAMILIES[name][3]


def tiny_family_model(name: str, seed: int = 0, **overrides):
    """The tiny random float32 model of family ``name`` (:data:`FAMILIES`), eval mode; weights normal
    of std 0.2 (norm scales too, so that they matter), seeded."""
    model_class, config_class, shape, _ = FAMILIES[name]
    torch.manual_seed(seed)
    config = config_class(
        **{"vocab_size": VOCAB, "num_hidden_layers": LAYERS, "max_position_embeddings": 256, **shape, **overrides}
    )
    model = model_class(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.2)
    return model


def gguf_names(model) -> dict[str, str]:
    """transformers' parameter names of ``model`` -> its GGUF tensor names (a tied output layer has none)."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not model.config.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    parts = {
        **family.LAYER_TENSORS,
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "self_attn.qkv_proj": "attn_qkv",  # Phi-3's fused q/k/v
        "mlp.gate_up_proj": "ffn_up",  # Phi-3's gate and up rows, as llama.cpp stores them
    }
    if model.config.model_type in ("gemma2", "gemma3_text"):
        parts.update(GEMMA_NORMS)
    state = model.state_dict()
    for index in range(model.config.num_hidden_layers):
        for hf, ours in parts.items():
            for kind in ("weight", "bias"):
                if f"model.layers.{index}.{hf}.{kind}" in state:
                    names[f"model.layers.{index}.{hf}.{kind}"] = f"blk.{index}.{ours}.{kind}"
    return names


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's ``LlamaModel.permute``: each head's rotary halves interleaved (rows, or a bias)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _heads(config, name: str) -> int:
    return int(config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads)


# --- A tokenizer and chat format per family ---------------------------------------------------------

# Each family's chat template, as its instruct model's file carries it (reduced to the roles' rules).
CHATML = (  # Qwen2.5 / Qwen3: ChatML, a default system message when the conversation has none
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PHI3_CHAT = (  # Phi-3 / 3.5-mini-instruct
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
MISTRAL_CHAT = (  # Mistral-7B-Instruct-v0.1: no system role, user and assistant alternate
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
# name -> (special tokens after the 256 byte tokens, eos token, chat template)
CHAT_FORMATS = {
    "llama": (["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], "<|end_of_text|>", None),
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", CHATML),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", CHATML),
    "mistral": (["<s>", "</s>", "[INST]", "[/INST]"], "</s>", MISTRAL_CHAT),
    "phi3": (["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], "<|endoftext|>", PHI3_CHAT),
}
CHAT_FORMATS["phi3-longrope"] = CHAT_FORMATS["phi3"]
# The tokens that end a stream in each family's chat format (its eos and end-of-turn tokens).
STOP_TOKENS = {
    "qwen2": ("<|im_end|>", "<|endoftext|>"),
    "qwen3": ("<|im_end|>", "<|endoftext|>"),
    "mistral": ("</s>",),
    "phi3": ("<|end|>", "<|endoftext|>"),
}


def vocabulary(name: str) -> list[str]:
    """Family ``name``'s tiny vocabulary: GPT-2's byte alphabet (any text tokenizes, a byte a token:
    no merges; the real families' own vocabularies are byte-level BPE too, but for Mistral's and Phi-3's
    SentencePiece) and the family's special tokens after it.  A model to write with it has
    ``vocab_size=len(vocabulary(name))``."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelling = bytes_to_unicode()
    return [spelling[byte] for byte in range(256)] + CHAT_FORMATS[name][0]


def random_q4_k(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random Q4_K blocks ``[rows, width / 256 * 144]`` (uint8) of a matrix of ``shape``, seeded by its
    name: gguf-py cannot quantize to Q4_K, so a Q4_K file holds these instead of the model's weights
    (its :func:`stored_reference` then runs on them).  Scales ``d``/``dmin`` in 1e-4..1e-3, so that
    weights stay below 1 in size."""
    rows, width = shape
    if width % 256:
        raise ValueError(f"{name}: a Q4_K row is whole blocks of 256, not {width}")
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    blocks = rng.integers(0, 256, size=(rows, width // 256, 144), dtype=np.uint8)
    blocks[..., 0:4] = rng.uniform(1e-4, 1e-3, size=(rows, width // 256, 2)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def _add_tokenizer(writer, name: str) -> None:
    specials, eos, template = CHAT_FORMATS[name]
    tokens = vocabulary(name)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3] * len(specials))  # normal, then control
    writer.add_token_scores([0.0] * len(tokens))  # no merges: transformers derives none from these
    writer.add_eos_token_id(tokens.index(eos))
    writer.add_bos_token_id(256)
    writer.add_add_bos_token(False)
    if template is not None:
        writer.add_chat_template(template)


# Google's chat templates (tokenizer_config.json): Gemma 2's refuses a system role; Gemma 3's puts
# the system message at the head of the first user turn.  Both call the assistant "model".
GEMMA2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    '{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = "" -%}'
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    '{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}{%- endif -%}'
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}"
    "{%- else -%}{{ raise_exception(\"Invalid content type\") }}{%- endif -%}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}"
)
# A Gemma-like SentencePiece vocabulary of VOCAB tokens: Gemma's special tokens at Gemma's ids
# (pad 0, eos 1, bos 2, unk 3; <start_of_turn>/<end_of_turn> are 106/107 in Gemma's own), then
# one token per character of plain English text and a few words.
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
_PIECES = ["\u2581", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\n"]
_PIECES += ["\u2581" + word for word in ("Hi", "Be", "brief", "hello", "there", "How", "are", "you")]
GEMMA_TOKENS = GEMMA_SPECIALS + _PIECES + [f"<unused{i}>" for i in range(VOCAB - len(GEMMA_SPECIALS) - len(_PIECES))]
# Gemma in the families' byte-level form (:func:`vocabulary`; Gemma's own is SentencePiece, as
# GEMMA_TOKENS): its turn tokens and templates, <end_of_turn> and <eos> ending a stream.
_GEMMA_CHAT_TOKENS = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
CHAT_FORMATS["gemma2"] = (_GEMMA_CHAT_TOKENS, "<eos>", GEMMA2_CHAT_TEMPLATE)
CHAT_FORMATS["gemma3"] = (_GEMMA_CHAT_TOKENS, "<eos>", GEMMA3_CHAT_TEMPLATE)
STOP_TOKENS["gemma2"] = STOP_TOKENS["gemma3"] = ("<end_of_turn>", "<eos>")
# The families whose template has no system role (it refuses a conversation with one).
NO_SYSTEM_ROLE = {"mistral": "roles must alternate", "gemma2": "System role not supported"}


def _write_gemma_tokenizer(writer, chat_template: str) -> None:
    """A SentencePiece (``llama``) tokenizer of :data:`GEMMA_TOKENS`, as ``convert_hf_to_gguf``
    writes Gemma's, with ``chat_template``."""
    specials = len(GEMMA_SPECIALS)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(GEMMA_TOKENS)
    writer.add_token_scores([0.0] * specials + [-float(i) for i in range(len(GEMMA_TOKENS) - specials)])
    writer.add_token_types([3, 3, 3, 2, 3, 3] + [1] * (len(GEMMA_TOKENS) - specials))  # control, unknown, normal
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(chat_template)


# A SentencePiece vocabulary as Mistral's and Phi-3's GGUF files carry it (llama.cpp's ``llama``
# tokenizer model, which transformers reads with Llama's tokenizer: its decoder strips the text's
# first space): <unk>, <s>, </s>, the 256 byte-fallback tokens, then words whose ``▁`` is a space.
SENTENCEPIECE_WORDS = ["\u2581", "\u2581H", "\u2581He", "\u2581Hel", "\u2581Hell", "\u2581Hello", "\u2581w", "\u2581wo"]
SENTENCEPIECE_WORDS += ["\u2581wor", "\u2581worl", "\u2581world", *"Helowrd", "\u00e9"]
SENTENCEPIECE_TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), *SENTENCEPIECE_WORDS]


def _write_sentencepiece_tokenizer(writer) -> None:
    """:data:`SENTENCEPIECE_TOKENS` as ``convert_hf_to_gguf`` writes a SentencePiece vocabulary
    (control, byte and normal token types; a BOS added), with Mistral's chat template."""
    words = len(SENTENCEPIECE_WORDS)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(SENTENCEPIECE_TOKENS)
    writer.add_token_scores([0.0] * (3 + 256) + [-float(i) for i in range(words)])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * words)  # unknown, control, byte, normal
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(MISTRAL_CHAT)


def write_gguf(
    model,
    path: Path,
    kind: int,
    *,
    architecture: str = "llama",
    corrupt: str = "",
    tokenizer: str = "",
    chat_template: str | None = None,
) -> dict[str, np.ndarray]:
    """Write ``model`` as a GGUF file of ``architecture`` with its matrices in ggml type ``kind``
    (vectors in F32, as llama.cpp keeps them); returns the values each tensor holds as stored
    (dequantized), under GGUF names.  ``corrupt="kv_heads"`` writes a wrong KV head count (1: the key and value
    tensors disagree with it), ``"kv_groups"`` one that does not divide the heads (3),
    ``"partial_rope"`` a rotary width of 3/4 of the head;
    ``"no_softcaps"`` leaves Gemma 2's soft-caps out, ``"no_sliding_window"`` the window;
    ``tokenizer``: a family name whose :func:`vocabulary` and chat template the file carries, or
    ``"sentencepiece"`` (:data:`SENTENCEPIECE_TOKENS`);
    ``chat_template``: Gemma's tokenizer (:data:`GEMMA_TOKENS`) with this template instead."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    if chat_template is not None:
        _write_gemma_tokenizer(writer, chat_template)
    elif tokenizer == "sentencepiece":
        _write_sentencepiece_tokenizer(writer)
    elif tokenizer:
        _add_tokenizer(writer, tokenizer)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    kv_heads = {"kv_heads": 1, "kv_groups": 3}.get(corrupt, config.num_key_value_heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if architecture != "gemma3":  # Gemma 3's rope_parameters are per layer type (see _write_gemma_metadata)
        writer.add_rope_freq_base(float((config.rope_parameters or {}).get("rope_theta", 10000.0)))
    dim = family.head_dim(config)
    if dim != config.hidden_size // config.num_attention_heads:
        writer.add_key_length(dim)
        writer.add_value_length(dim)
    if getattr(config, "sliding_window", None) and corrupt != "no_sliding_window":
        writer.add_sliding_window(config.sliding_window)
    if corrupt == "partial_rope":  # Phi-4-mini's file: rotary embeddings on 3/4 of each head
        writer.add_rope_dimension_count(dim * 3 // 4)
    rope = config.rope_parameters or {}
    if rope.get("rope_type") == "longrope":  # llama.cpp's Phi-3 converter: two factor tensors, two keys
        writer.add_rope_dimension_count(dim)
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        factor = config.max_position_embeddings / rope["original_max_position_embeddings"]
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(factor) / math.log(rope["original_max_position_embeddings"]))
        )
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
    _write_gemma_metadata(writer, config, architecture, softcaps=corrupt != "no_softcaps")
    offset = NORM_OFFSETS.get(architecture, 0.0)
    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    stored = {}
    qtype = gguf.GGMLQuantizationType(kind)
    for hf, name in gguf_names(model).items():
        values = state[hf]
        if architecture == "llama" and (".attn_q." in name or ".attn_k." in name):
            values = permute(values, _heads(config, name))
        if name.endswith("norm.weight"):
            values = values + offset
        if values.ndim == 1:
            writer.add_tensor(name, values.astype(np.float32))
            stored[name] = values
            continue
        if kind == ggml.F32:
            data = values.astype(np.float32)
        elif kind == ggml.F16:
            data = values.astype(np.float16)
        elif kind == ggml.Q4_K:
            data = random_q4_k(name, values.shape)
        else:
            data = gguf.quants.quantize(values, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype if kind not in (ggml.F32, ggml.F16) else None)
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(values.shape[0], -1)
        stored[name] = ggml.dequantize(torch.from_numpy(raw.copy()), kind, values.shape[1]).numpy()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def _write_gemma_metadata(writer, config, architecture: str, softcaps: bool = True) -> None:
    """What ``convert_hf_to_gguf``'s ``Gemma2Model``/``Gemma3Model`` write beyond the shared keys
    (Gemma 2's soft-caps only where ``softcaps``)."""
    if architecture == "gemma2" and softcaps:
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    elif architecture == "gemma3":
        full = config.rope_parameters["full_attention"]
        writer.add_rope_freq_base(float(full["rope_theta"]))
        if full.get("rope_type") == "linear":
            import gguf

            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(float(full["factor"]))
        if config.final_logit_softcapping:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)


def stored_reference(model, stored: dict[str, np.ndarray], *, architecture: str = "llama"):
    """``model`` with every weight replaced by what the file stores, q/k rows back in transformers'
    order where the architecture permuted them, norm offsets taken off where the converter added
    them; returns ``model``."""
    names = gguf_names(model)
    offset = NORM_OFFSETS.get(architecture, 0.0)
    state = {}
    for name, tensor in model.state_dict().items():
        ours = names.get(name, "token_embd.weight")  # a tied lm_head.weight is the embedding's
        values = torch.from_numpy(stored[ours].copy()).reshape(tensor.shape)
        if ours.endswith("norm.weight"):
            values = values - offset
        if architecture == "llama" and (".attn_q." in ours or ".attn_k." in ours):
            values = values[family.unpermute_rows(values.shape[0], _heads(model.config, ours))]
        state[name] = values
    model.load_state_dict(state)
    return model


def write_tiny_gguf(path: Path, name: str = "qwen3", kind: int = ggml.Q8_0, seed: int = 0) -> Path:
    """Write family ``name``'s tiny random model (seeded) with its tokenizer and chat template as a
    GGUF file at ``path`` (ggml type ``kind`` for its matrices); returns ``path``.  A model of
    another shape and tokenizer than the embedded one, for serving beside it."""
    model = tiny_family_model(name, seed=seed, vocab_size=len(vocabulary(name)))
    write_gguf(model, path, kind, architecture=architecture(name), tokenizer=name)
    return path


def no_stop_bias(name: str = "qwen3") -> dict[str, int]:
    """A ``logit_bias`` keeping family ``name``'s stop tokens from being sampled: exactly ``max_tokens`` tokens."""
    vocabulary_of = vocabulary(name)
    return {str(vocabulary_of.index(token)): -100 for token in STOP_TOKENS[name]}
