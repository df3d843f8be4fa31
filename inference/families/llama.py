"""The Llama family's checkpoints as the runner reads them: a transformers model, or a GGUF file.

Both give a :class:`LlamaWeights`: the model's dimensions, rotary frequencies, norm scales and linear
layers, with q/k/v and gate/up stacked along their output rows (one product each).  The runner
(:class:`inference.llama.LlamaModelRunner`) reads nothing else.  The other families the runner
takes (:mod:`inference.families.qwen`, :mod:`inference.families.gemma`) are read by the same code,
as their :class:`~.family.Family` says: q/k/v biases and sliding windows where the checkpoint has
them, per-head q/k norms, Gemma's norm offsets, output norms, activation, scales, soft-caps and
per-layer-type rotary bases.  Mistral
is Llama with a sliding window (``model_type`` ``mistral``; its GGUF files are ``llama`` ones).

A GGUF file of architecture ``llama`` (llama.cpp's converter writes SmolLM2, Llama 2/3.x, TinyLlama
so) has its dimensions under ``llama.*`` metadata keys and its tensors under ggml's names
(``blk.0.attn_q.weight``).  llama.cpp's converter interleaves each head's rotary halves in the q/k
rows (``convert_hf_to_gguf``'s ``LlamaModel.permute``); :func:`unpermute_rows` puts them back in
transformers' order.  Llama 3.1's rope scaling is stored as a tensor, ``rope_freqs.weight``, the
divisor of each inverse frequency (llama.cpp's ``freq_factors``); linear scaling as metadata.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import LlamaConfig, PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..formats import ggml
from ..formats.gguf import GGUFFile, ModelFileError
from .family import Family, architectures, for_architecture, for_model_type, layer_windows, model_types, register

logger = logging.getLogger(__name__)

Linear = Callable[[torch.Tensor], torch.Tensor]
LLAMA = register(Family("llama", ("llama",), ("llama", "mistral"), LlamaConfig, permuted_qk=True))
# Rope variants whose frequencies do not depend on the sequence length within max_position_embeddings
# ("dynamic" NTK scaling only changes them beyond it, where the runner never goes; "longrope" within
# original_max_position_embeddings, the context the runner then serves: see served_context).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
OUTPUT_NAME = "lm_head.weight"  # the name a linear factory is given for the output layer (tied or not)

# A decoder layer's tensors: transformers' name -> ggml's.
LAYER_TENSORS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


@dataclass
class LlamaLayer:
    """One decoder layer: RMSNorm scales ``[hidden]`` (float, the runner's dtype) and its linears;
    the other families' differences, None where the layer is Llama's."""

    input_norm: torch.Tensor
    qkv: Linear  # [tokens, hidden] -> [tokens, (heads + 2 kv_heads) * head_dim]
    o: Linear  # [tokens, heads * head_dim] -> [tokens, hidden]
    post_norm: torch.Tensor
    gate_up: Linear  # [tokens, hidden] -> [tokens, 2 * intermediate]
    down: Linear  # [tokens, intermediate] -> [tokens, hidden]
    qkv_bias: torch.Tensor | None = None  # [(heads + 2 kv_heads) * head_dim], added to qkv's output (Qwen2)
    q_norm: torch.Tensor | None = None  # [head_dim]: RMSNorm scales of each query head, before rope (Qwen3)
    k_norm: torch.Tensor | None = None  # [head_dim]: ... of each key head
    window: int | None = None  # a query attends to this many positions, itself included (sliding window)
    # Gemma's: RMSNorm scales [hidden] of the attention's and the MLP's outputs, before the residual add
    attention_output_norm: torch.Tensor | None = None
    mlp_output_norm: torch.Tensor | None = None
    attention_softcap: float | None = None  # attention scores become tanh(s / cap) * cap (Gemma 2)
    rope: tuple[torch.Tensor, float] | None = None  # this layer's (inv_freq, scale), None: the model's


@dataclass
class LlamaWeights:
    """What the runner runs: dimensions, rotary inverse frequencies ``[head_dim / 2]`` (float32) and
    their cos/sin scale, and the weights.  ``embedding``: a table ``[vocab, hidden]``, or None when
    ``embedding_rows(ids) -> [n, hidden]`` float32 reads the rows from the output layer's or the
    file's blocks (no float copy of the vocabulary).  ``description``: the weights' formats, for the log."""

    config: PretrainedConfig
    inv_freq: torch.Tensor
    rope_scaling: float
    embedding: torch.Tensor | None
    embedding_rows: Callable[[torch.Tensor], torch.Tensor] | None
    layers: list[LlamaLayer]
    final_norm: torch.Tensor
    lm_head: Linear
    vocab_size: int
    description: str
    formats: dict[str, int] = field(default_factory=dict)  # GGUF: tensors per ggml type
    hidden_act: str = "silu"  # the MLP's gate activation (transformers' name): silu or gelu_pytorch_tanh
    embedding_scale: float | None = None  # the embeddings are multiplied by it (Gemma: sqrt(hidden))
    attention_scale: float | None = None  # attention scores' scale, None: head_dim ** -0.5
    final_logit_softcapping: float | None = None  # logits become tanh(l / cap) * cap


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def served_context(config) -> int:
    """The positions the runner serves of a model: ``max_position_embeddings``, or for longrope
    ``original_max_position_embeddings``, the length up to which its frequencies (the short
    factors) do not change with the sequence's length (:mod:`inference.families.phi3`)."""
    rope = getattr(config, "rope_parameters", None) or {}
    context = int(config.max_position_embeddings)
    if rope.get("rope_type") == "longrope":
        original = rope.get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None
        )
        context = min(context, int(original or context))
    return context


def _rope_parameters_per_layer_type(config) -> bool:
    """Whether ``config.rope_parameters`` holds one rope per layer type (transformers' Gemma 3 form)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return bool(parameters) and set(parameters) <= {"full_attention", "sliding_attention"}


def rope_frequencies(config, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[head_dim / 2]`` (float32) and the cos/sin scale, as transformers
    computes them; ``layer_type``: which of a per-layer-type ``rope_parameters`` (Gemma 3's)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        parameters = parameters[layer_type]
    rope_type = parameters.get("rope_type", "default")
    if rope_type == "default":
        # transformers' default: base ** (2i / dim), in float32 from int64 exponents
        dim = head_dim(config)
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (float(parameters["rope_theta"]) ** exponents), 1.0
    extra = {} if layer_type is None else {"layer_type": layer_type}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, **extra)
    return inv_freq.float(), float(scaling)


def model_rope(config) -> tuple[torch.Tensor, float]:
    """The model's rope (its global layers' where each layer type has its own)."""
    return rope_frequencies(config, "full_attention" if _rope_parameters_per_layer_type(config) else None)


def layer_ropes(config) -> list[tuple[torch.Tensor, float] | None]:
    """Per layer, its own rope where it differs from :func:`model_rope` (Gemma 3's local layers), else None."""
    if not _rope_parameters_per_layer_type(config):
        return [None] * int(config.num_hidden_layers)
    kinds = {kind: rope_frequencies(config, kind) for kind in set(config.layer_types) - {"full_attention"}}
    return [kinds.get(kind) for kind in config.layer_types]


def attention_softcap(config) -> float | None:
    """The attention scores' soft-cap of every layer (Gemma 2's ``attn_logit_softcapping``), or None."""
    return getattr(config, "attn_logit_softcapping", None) or None


def model_extras(config, family: Family) -> dict:
    """The :class:`LlamaWeights` fields a family's config sets beyond Llama's (Gemma's)."""
    scalar = getattr(config, "query_pre_attn_scalar", None)
    return {
        "hidden_act": family.activation,
        "embedding_scale": float(config.hidden_size) ** 0.5 if family.embedding_scale else None,
        "attention_scale": None if scalar is None else float(scalar) ** -0.5,
        "final_logit_softcapping": getattr(config, "final_logit_softcapping", None) or None,
    }


def exact_rows(linear) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``linear``'s ``embedding_rows`` where its format keeps the weight's rows exactly
    (:meth:`inference.weights.WeightLinear.embedding_rows`), else None."""
    rows_of = getattr(linear, "embedding_rows", None)
    if rows_of is None or rows_of(torch.zeros(1, dtype=torch.long)) is None:
        return None
    return rows_of


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The row index that undoes llama.cpp's q/k interleaving of ``rows`` rows of ``heads`` heads:
    ``weight[index]`` is in transformers' order."""
    index = torch.arange(rows)
    return index.reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


# --- A GGUF file ------------------------------------------------------------------------------------


def config_from_gguf(file: GGUFFile):
    """The transformers config of a GGUF file of a family's architecture (its ``<arch>.*`` metadata
    and tensor shapes), of the family's ``config_class``; raises :class:`ModelFileError` for another
    architecture, or when a key is missing or a tensor's shape disagrees with it."""
    arch = file.require("general.architecture")
    family = for_architecture(arch)
    if family is None:
        raise ModelFileError(f"{file.path}: architecture {arch!r} is not one of {', '.join(architectures())}")

    def key(name: str, default=None):
        value = file.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelFileError(f"{file.path}: the metadata lacks {arch}.{name}")
        return value

    if "token_embd.weight" not in file.tensors:
        raise ModelFileError(f"{file.path}: the file has no token_embd.weight tensor")
    vocab, hidden = file.tensors["token_embd.weight"].shape
    heads = int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        # Each KV head serves a whole group of query heads; no other split can run.
        raise ModelFileError(
            f"{file.path}: {arch}.attention.head_count {heads} is not a multiple of "
            f"{arch}.attention.head_count_kv {kv_heads}"
        )
    dim = int(key("attention.key_length", 0) or key("rope.dimension_count", 0) or int(key("embedding_length")) // heads)
    rotated = int(key("rope.dimension_count", 0) or 0)
    stored = file.tensors.get("blk.0.attn_q.weight") or file.tensors.get("blk.0.attn_qkv.weight")
    if rotated and stored is not None:
        rows = int(stored.shape[0]) // (heads if stored.name.endswith("attn_q.weight") else heads + 2 * kv_heads)
        if rotated < rows:  # Phi-4-mini's: rotary embeddings on part of each head only
            raise ModelFileError(
                f"{file.path}: rotary embeddings on {rotated} of each head's {rows} dimensions (partial rotary, "
                "as Phi-4-mini's) are not supported from a GGUF file; serve the model's transformers folder"
            )
    rope: dict = {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))}
    scaling = file.get(f"{arch}.rope.scaling.type")
    if scaling == "linear":
        rope = {**rope, "rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise ModelFileError(f"{file.path}: rope scaling {scaling!r} is not supported (none, linear, or rope_freqs)")
    extra: dict = {}
    if "rope_factors_short.weight" in file.tensors or "rope_factors_long.weight" in file.tensors:
        # Longrope (Phi-3's): the divisors of each inverse frequency for short and long sequences.
        short = file.floats(
            "rope_factors_short.weight" if "rope_factors_short.weight" in file.tensors else "rope_factors_long.weight"
        )
        long = file.floats(
            "rope_factors_long.weight" if "rope_factors_long.weight" in file.tensors else "rope_factors_short.weight"
        )
        original = int(key("rope.scaling.original_context_length"))
        rope = {
            **rope,
            "rope_type": "longrope",
            "short_factor": short.reshape(-1).tolist(),
            "long_factor": long.reshape(-1).tolist(),
            "original_max_position_embeddings": original,
        }
        if file.get(f"{arch}.rope.scaling.attn_factor") is not None:
            rope["attention_factor"] = float(key("rope.scaling.attn_factor"))
        extra["original_max_position_embeddings"] = original
    window = int(file.get(f"{arch}.attention.sliding_window", 0) or 0)
    # Every layer's (max_window_layers 0 for Qwen's configs, which read use_sliding_window).
    windowed = {"sliding_window": window, "use_sliding_window": True, "max_window_layers": 0} if window else {}
    own = family.gguf_config(file, arch) if family.gguf_config is not None else {}
    config = family.config_class(
        vocab_size=int(vocab),
        hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=dim,
        max_position_embeddings=int(key("context_length", 4096)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_parameters=own.pop("rope_parameters", rope),
        tie_word_embeddings="output.weight" not in file.tensors,
        bos_token_id=file.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=file.get("tokenizer.ggml.eos_token_id"),
        **{**windowed, **extra, **own},
    )
    if hidden != config.hidden_size:
        raise ModelFileError(
            f"{file.path}: token_embd.weight is {hidden} wide, but {arch}.embedding_length says {config.hidden_size}"
        )
    _check_shapes(file, config, family)
    return config


def _check_shapes(file: GGUFFile, config, family: Family) -> None:
    dim, hidden, inter = head_dim(config), config.hidden_size, config.intermediate_size
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads or config.num_attention_heads)
    expected = {
        "attn_norm": (hidden,),
        "attn_q": (heads * dim, hidden),
        "attn_k": (kv_heads * dim, hidden),
        "attn_v": (kv_heads * dim, hidden),
        "attn_output": (hidden, heads * dim),
        "ffn_norm": (hidden,),
        "ffn_gate": (inter, hidden),
        "ffn_up": (inter, hidden),
        "ffn_down": (hidden, inter),
    }
    if family.qk_norm:
        expected.update({"attn_q_norm": (dim,), "attn_k_norm": (dim,)})
    if family.sandwich_norms:
        expected.update({"post_attention_norm": (hidden,), "post_ffw_norm": (hidden,)})
    biases = {part: expected[part][:1] for part in ("attn_q", "attn_k", "attn_v")}
    if family.fused_qkv:  # q, k and v's rows in one tensor
        for part in ("attn_q", "attn_k", "attn_v"):
            del expected[part]
        expected["attn_qkv"] = ((heads + 2 * kv_heads) * dim, hidden)
    if family.fused_gate_up:  # ffn_up holds the gate's rows, then the up projection's
        del expected["ffn_gate"]
        expected["ffn_up"] = (2 * inter, hidden)
    names = {
        f"blk.{i}.{part}.weight": shape for i in range(config.num_hidden_layers) for part, shape in expected.items()
    }
    for i in range(config.num_hidden_layers):  # biases are optional: checked where the file has them
        for part in ("attn_q", "attn_k", "attn_v"):
            if f"blk.{i}.{part}.bias" in file.tensors:
                names[f"blk.{i}.{part}.bias"] = biases[part]
    names["output_norm.weight"] = (hidden,)
    for name in ("rope_factors_short.weight", "rope_factors_long.weight"):
        if name in file.tensors:
            names[name] = (dim // 2,)
    if "output.weight" in file.tensors:
        names["output.weight"] = (config.vocab_size, hidden)
    for name, shape in names.items():
        info = file.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{file.path}: the file has no {name} tensor ({config.num_hidden_layers} layers)")
        if info.shape != shape:
            raise ModelFileError(
                f"{file.path}: tensor {name} has shape {list(info.shape)}, but the metadata says {list(shape)}"
            )


def gguf_weights(file: GGUFFile, config, dtype: torch.dtype, weights: str = "auto") -> LlamaWeights:
    """The runner's weights from ``file``: each linear in its stored type (``weights`` ``auto``,
    :func:`inference.formats.ggml.linear`), or dequantized and rebuilt in a format of
    :mod:`inference.weights` (``weights`` a format name, e.g. ``float32`` for the deterministic
    mode; tensor by tensor, so the peak is one tensor's float32 copy more).  ``dtype``: the
    activations' (norms are kept in it).  Raises ``NotImplementedError`` where a stored block type
    needs our kernels and they cannot run here."""
    from .. import weights as formats

    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads or config.num_attention_heads)
    family = for_architecture(file.require("general.architecture"))
    if family is None:
        raise ModelFileError(f"{file.path}: architecture {file.get('general.architecture')!r} has no family here")
    counts: dict[str, int] = {}

    def in_order(rows: torch.Tensor, name: str) -> torch.Tensor:
        """A q/k weight's rows (or bias) in transformers' order: llama.cpp permuted only ``llama``'s."""
        if family.permuted_qk and (".attn_q." in name or ".attn_k." in name):
            return rows[unpermute_rows(rows.shape[0], heads if ".attn_q." in name else kv_heads)]
        return rows

    def part(name: str) -> tuple[torch.Tensor, int, int]:
        info = file.tensors[name]
        counts[info.type_name] = counts.get(info.type_name, 0) + 1
        return in_order(file.raw(name), name), info.ggml_type, info.shape[-1]

    def build(*names: str) -> Linear:
        parts = [part(name) for name in names]
        if weights != "auto":
            weight = torch.cat([ggml.dequantize(raw, kind, width) for raw, kind, width in parts])
            return formats.make_linear(weight, None, weights)
        kinds = {kind for _, kind, _ in parts}
        if len(kinds) == 1:  # one product over the stacked rows (a copy of them: the file's are apart)
            raw = parts[0][0] if len(parts) == 1 else torch.cat([raw for raw, _, _ in parts])
            linear: Linear = ggml.linear(raw, parts[0][1], parts[0][2])
        else:
            linear = ggml.StackedLinear([ggml.linear(raw, kind, width) for raw, kind, width in parts])
        for name, (raw, kind, _) in zip(names, parts):
            if ggml.interleaves(kind, raw.shape[0]):  # a copy: the file's pages leave the resident set
                file.release(name)
        return linear

    def vector(name: str) -> torch.Tensor:
        counts[file.tensors[name].type_name] = counts.get(file.tensors[name].type_name, 0) + 1
        return in_order(file.floats(name), name).to(dtype)

    def qkv_bias(prefix: str) -> torch.Tensor | None:
        """q, k and v's biases stacked as their rows are, zeros for one the file lacks; None for none."""
        names = [f"{prefix}{part}.bias" for part in ("attn_q", "attn_k", "attn_v")]
        if not any(name in file.tensors for name in names):
            return None
        dim = head_dim(config)
        sizes = (heads * dim, kv_heads * dim, kv_heads * dim)
        return torch.cat(
            [
                vector(name) if name in file.tensors else torch.zeros(size, dtype=dtype)
                for name, size in zip(names, sizes)
            ]
        )

    windows, ropes, softcap = layer_windows(config), layer_ropes(config), attention_softcap(config)
    layers = []
    started, reported = time.perf_counter(), 0
    for index in range(config.num_hidden_layers):
        # Progress a quarter of the layers at a time: a big file's first start reads gigabytes.
        if index * 4 // config.num_hidden_layers > reported:
            reported = index * 4 // config.num_hidden_layers
            logger.info(
                "%s: %d of %d layers read (%.1f s)",
                file.path.name,
                index,
                config.num_hidden_layers,
                time.perf_counter() - started,
            )
        prefix = f"blk.{index}."
        qkv_names = [prefix + part + ".weight" for part in ("attn_q", "attn_k", "attn_v")]
        if family.fused_qkv:
            qkv_names = [prefix + "attn_qkv.weight"]
        gate_up_names = (
            [prefix + "ffn_up.weight"]
            if family.fused_gate_up
            else [prefix + "ffn_gate.weight", prefix + "ffn_up.weight"]
        )
        layers.append(
            LlamaLayer(
                input_norm=vector(prefix + "attn_norm.weight"),
                qkv=build(*qkv_names),
                o=build(prefix + "attn_output.weight"),
                post_norm=vector(prefix + "ffn_norm.weight"),
                gate_up=build(*gate_up_names),
                down=build(prefix + "ffn_down.weight"),
                qkv_bias=qkv_bias(prefix),
                q_norm=vector(prefix + "attn_q_norm.weight") if family.qk_norm else None,
                k_norm=vector(prefix + "attn_k_norm.weight") if family.qk_norm else None,
                window=windows[index],
                attention_output_norm=vector(prefix + "post_attention_norm.weight") if family.sandwich_norms else None,
                mlp_output_norm=vector(prefix + "post_ffw_norm.weight") if family.sandwich_norms else None,
                attention_softcap=softcap,
                rope=ropes[index],
            )
        )
    bfloat16_prefill = (
        ggml.choose_bfloat16_prefill(
            [linear for layer in layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        )
        if weights == "auto" and dtype == torch.float32
        else []
    )
    tied = "output.weight" not in file.tensors
    lm_head = build("token_embd.weight" if tied else "output.weight")
    embedding, embedding_rows = None, None
    if tied and dtype == torch.float32:  # the output layer's exact rows (Q8_0), or its float32 weight
        embedding_rows = exact_rows(lm_head)
        if embedding_rows is None and isinstance(lm_head, formats.Float32Linear):
            embedding = lm_head.weight
    if embedding is None and embedding_rows is None and dtype == torch.float32:  # the file's own blocks
        info = file.tensors["token_embd.weight"]
        embedding_rows = ggml.rows_reader(file.raw("token_embd.weight"), info.ggml_type, info.shape[-1])
    if embedding is None and embedding_rows is None:
        embedding = file.floats("token_embd.weight").to(dtype)
    inv_freq, rope_scaling = model_rope(config)
    if "rope_freqs.weight" in file.tensors:  # Llama 3.1's scaling: a divisor per frequency
        inv_freq = inv_freq / file.floats("rope_freqs.weight").reshape(-1)
    described = ", ".join(f"{name} x {count}" for name, count in sorted(counts.items(), key=lambda c: -c[1]))
    kind = "GGUF blocks as stored" if weights == "auto" else f"{weights} from the GGUF"
    if bfloat16_prefill:
        described += f"; {', '.join(bfloat16_prefill)} layers in bfloat16 from {formats.BFLOAT16_PREFILL_ROWS} rows"
    return LlamaWeights(
        config=config,
        inv_freq=inv_freq,
        rope_scaling=rope_scaling,
        embedding=embedding,
        embedding_rows=embedding_rows,
        layers=layers,
        final_norm=vector("output_norm.weight"),
        lm_head=lm_head,
        vocab_size=config.vocab_size,
        description=f"{kind} ({described})",
        formats=counts,
        **model_extras(config, family),
    )


# --- A transformers model -----------------------------------------------------------------------------

# (weight [out, in], activation dtype, names of the model's parameters stacked into weight) -> linear
LinearFactory = Callable[[torch.Tensor, torch.dtype, tuple[str, ...]], Linear]


def unsupported_reason(model) -> str | None:
    """Why the runner cannot run ``model`` (a transformers causal LM), or None if it can.

    Supported: a registered family's ``model_type`` (:func:`~.family.model_types`), biases on q/k/v
    only, the family's MLP activation, full rotary embeddings of a static variant (:data:`STATIC_ROPE_TYPES`), full or
    sliding-window attention layers, plain ``nn.Linear`` layers (not prepacked or quantized).
    """
    config = model.config
    family = for_model_type(getattr(config, "model_type", None))
    if family is None:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of {model_types()}"
    if getattr(config, "mlp_bias", False):
        return "the MLP layers have a bias"
    kinds = set(getattr(config, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    if kinds:
        return f"layer_types {sorted(kinds)} are not full or sliding-window attention"
    activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if activation != family.activation:
        return f"the MLP's activation {activation!r} is not the {family.name} family's {family.activation!r}"
    ropes = getattr(config, "rope_parameters", None) or {}
    for rope in ropes.values() if _rope_parameters_per_layer_type(config) else [ropes]:
        if rope.get("rope_type", "default") not in STATIC_ROPE_TYPES:
            return f"rope_type {rope.get('rope_type')!r} is not one of {STATIC_ROPE_TYPES}"
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            return "partial rotary embeddings"
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        return "partial rotary embeddings"
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        projections = _projections(attention, mlp)
        modules = (*projections[0], attention.o_proj, *projections[1], mlp.down_proj)
        if any(type(module) is not torch.nn.Linear for module in modules):
            return "linear layers are not plain nn.Linear (prepacked or quantized)"
        if any(module.bias is not None for module in modules[len(projections[0]) :]):
            return "the attention's output or the MLP layers have a bias"
        if family.fused_qkv and projections[0][0].bias is not None:
            return "the fused q/k/v projection has a bias"
        if family.qk_norm and not (hasattr(attention, "q_norm") and hasattr(attention, "k_norm")):
            return f"the {family.name} family's attention lacks its q/k norms"
        if family.sandwich_norms and not (
            hasattr(layer, "pre_feedforward_layernorm") and hasattr(layer, "post_feedforward_layernorm")
        ):
            return f"the {family.name} family's layer lacks its feed-forward norms"
    if type(model.get_output_embeddings()) is not torch.nn.Linear:
        return "the output layer is not a plain nn.Linear"
    return None


def transformers_weights(model, dtype: torch.dtype, linear_factory: LinearFactory) -> LlamaWeights:
    """The runner's weights from a loaded transformers Llama model: q/k/v and gate/up stacked (copies),
    every linear built by ``linear_factory`` (which may share the model's float32 weights), norms in
    ``dtype``.  Raises ``ValueError`` when :func:`unsupported_reason` names a reason."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"LlamaModelRunner cannot run this model: {reason}")
    config = model.config
    family = for_model_type(config.model_type)
    assert family is not None  # unsupported_reason says so otherwise
    windows, ropes, softcap = layer_windows(config), layer_ropes(config), attention_softcap(config)
    with torch.no_grad():
        layers = [
            _transformers_layer(index, layer, dtype, linear_factory, family, windows[index])
            for index, layer in enumerate(model.model.layers)
        ]
        for layer, rope in zip(layers, ropes):
            layer.rope, layer.attention_softcap = rope, softcap
        output = model.get_output_embeddings()
        lm_head = linear_factory(output.weight, dtype, (OUTPUT_NAME,))
        embedding: torch.Tensor | None = model.get_input_embeddings().weight.detach().to(dtype)
        embedding_rows = None
        # A tied embedding read from the output layer's own blocks where its format keeps them
        # exactly (Q8_0): no float32 copy of the vocabulary's rows (113 MB for SmolLM2).
        tied = model.get_input_embeddings().weight.data_ptr() == output.weight.data_ptr()
        if tied and dtype == torch.float32 and (rows := exact_rows(lm_head)) is not None:
            embedding, embedding_rows = None, rows
        final_norm = (model.model.norm.weight.detach() + family.norm_offset).to(dtype)
    inv_freq, rope_scaling = model_rope(config)
    description = getattr(linear_factory, "description", getattr(linear_factory, "__name__", "linear"))
    return LlamaWeights(
        config=config,
        inv_freq=inv_freq.to(output.weight.device),
        rope_scaling=rope_scaling,
        embedding=embedding,
        embedding_rows=embedding_rows,
        layers=layers,
        final_norm=final_norm,
        lm_head=lm_head,
        vocab_size=int(output.out_features),
        description=description,
        **model_extras(config, family),
    )


def _projections(attention, mlp) -> tuple[tuple, tuple]:
    """A transformers layer's q/k/v projections and its gate/up ones: three and two modules, or one
    each where the family fuses them (Phi-3's ``qkv_proj``, ``gate_up_proj``: gate rows first)."""
    qkv = (
        (attention.qkv_proj,)
        if hasattr(attention, "qkv_proj")
        else (attention.q_proj, attention.k_proj, attention.v_proj)
    )
    gate_up = (mlp.gate_up_proj,) if hasattr(mlp, "gate_up_proj") else (mlp.gate_proj, mlp.up_proj)
    return qkv, gate_up


def _transformers_layer(
    index: int, layer, dtype: torch.dtype, linear_factory: LinearFactory, family: Family, window: int | None
) -> LlamaLayer:
    attention, mlp = layer.self_attn, layer.mlp
    prefix = f"model.layers.{index}"
    projections, gate_up_projections = _projections(attention, mlp)
    bias = None
    if any(module.bias is not None for module in projections):
        bias = torch.cat(
            [
                module.bias
                if module.bias is not None
                else torch.zeros(module.out_features, device=module.weight.device)
                for module in projections
            ]
        )
    q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)

    def names(*parts: str) -> tuple[str, ...]:
        return tuple(f"{prefix}.{part}.weight" for part in parts)

    def norm(module) -> torch.Tensor:
        """A norm's scales as the runner multiplies by them (Gemma's stored ``w`` of ``x * (1 + w)``
        plus the 1), in ``dtype``."""
        return (module.weight.detach() + family.norm_offset).to(dtype)

    sandwich = family.sandwich_norms

    qkv = torch.cat([module.weight for module in projections])
    gate_up = torch.cat([module.weight for module in gate_up_projections])
    qkv_names = (
        ("self_attn.qkv_proj",)
        if len(projections) == 1
        else ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    )
    gate_up_names = ("mlp.gate_up_proj",) if len(gate_up_projections) == 1 else ("mlp.gate_proj", "mlp.up_proj")
    return LlamaLayer(
        input_norm=norm(layer.input_layernorm),
        qkv=linear_factory(qkv.detach(), dtype, names(*qkv_names)),
        o=linear_factory(attention.o_proj.weight.detach(), dtype, names("self_attn.o_proj")),
        post_norm=norm(layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm),
        gate_up=linear_factory(gate_up.detach(), dtype, names(*gate_up_names)),
        down=linear_factory(mlp.down_proj.weight.detach(), dtype, names("mlp.down_proj")),
        qkv_bias=None if bias is None else bias.detach().to(dtype),
        q_norm=None if q_norm is None else norm(q_norm),
        k_norm=None if k_norm is None else norm(k_norm),
        window=window,
        attention_output_norm=norm(layer.post_attention_layernorm) if sandwich else None,
        mlp_output_norm=norm(layer.post_feedforward_layernorm) if sandwich else None,
    )
