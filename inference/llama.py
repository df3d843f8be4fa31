"""Our own forward pass for the Llama family: :class:`LlamaModelRunner`, a ModelRunner without
transformers' per-step overhead.

transformers' modeling builds masks, updates its cache objects and dispatches dozens of small
modules per layer each step, most of a batch-1 decode step of the embedded model
(docs/performance.md#why-our-own-kernels).  This runner does what Llama's decoder layer does
(Touvron et al. 2023, "LLaMA": pre-RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query
attention from Ainslie et al. 2023) with as few tensor operations as it can:

- q/k/v and gate/up projections are each one matrix product of a stacked weight; every linear layer
  is built by one factory, :func:`make_linear`, so other weight formats plug in there.
- Rotary embeddings (Su et al. 2021, "RoFormer") read a precomputed cos/sin table, made from
  transformers' own inverse frequencies, so its rope-scaling variants stay right.
- The running batch's KV cache is preallocated per layer as ``[rows, kv_heads, capacity, head_dim]``
  and written in place: a decode step writes one column per row and attends over a view, with a
  boolean mask only when rows have different lengths.  Grouped-query attention folds each KV head's
  query heads into the query-length axis of ``scaled_dot_product_attention`` (measured faster on CPU
  than ``enable_gqa`` or repeating K/V, and it never materialises repeated keys and values).
- Prefill runs the linear layers over the tokens of all chunks packed together (no padding), and
  attention chunk by chunk, against each request's own partial cache (vLLM's "varlen" layout).
- The other families (:mod:`inference.families`) are data on each layer, not code paths: a q/k/v
  bias added to the stacked product's output (Qwen2), an RMSNorm of each query and key head before
  the rotary embeddings (Qwen3), a sliding window (Mistral).  Our kernels take the first two as
  they are (both are done before a kernel reads q/k/v); a decode step's attention kernel takes each
  layer's window, while a prefill pass where some query sees past its window attends in torch's
  operations (as does the one-call whole step, which has no window).  The cache keeps every
  position either way (no ring buffer: memory as for full attention).  Gemma's differences are
  data too: an embedding scale, norms on the attention's and MLP's outputs, GeGLU, a query scale
  (folded into the queries, so every attention path keeps ``head_dim ** -0.5``), a rotary table
  per layer (Gemma 3's local layers' base; our kernels take the layer's table), soft-capped
  final logits.  Soft-capped attention scores (Gemma 2) our kernels cannot compute: those
  layers' attention, and so Gemma 2's whole decode step, run in torch's operations
  (:func:`soft_capped_attention`); GeGLU's activation and the output norms are torch's too.

Rows of the running batch are contiguous: ``keep`` moves only the rows whose place changes, so an
engine that fills a leaving row's place with the last row moves one row, and decode never gathers.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from . import memory
from .chunks import PrefillChunk
from .cpu_kernels import STEP_PARTS, STEP_TABLE_FIELDS
from .families.llama import (
    LinearFactory,
    LlamaLayer,
    LlamaWeights,
    served_context,
    transformers_weights,
    unsupported_reason,
)
from .packed import PACKED_BATCH_HINT, onednn_linear_available
from .prefix_cache import PrefixCache

if TYPE_CHECKING:
    from .cpu_kernels import CPUKernels

Linear = Callable[[torch.Tensor], torch.Tensor]

ROW_CHUNK = 8  # the running batch's cache grows by this many rows: at most 4 copies on the way to 32
COLUMN_CHUNK = 64  # ... and its positions in multiples of this many, at least doubling (_reserve)
OUTPUT_NAME = "lm_head.weight"  # the name a factory is given for the output layer (tied or not)
# A prefill chunk's queries attend in blocks of this many: two calls of 256 queries were faster than one
# of 512 in torch's CPU flash attention (docs/performance.md#the-llama-runners-prefill).
ATTENTION_QUERIES = 256
ROPE_TABLE_CHUNK = 4096  # positions added to the cos/sin table at a time (Llama 3.1 allows 131072)


def make_linear(weight: torch.Tensor, dtype: torch.dtype, names: tuple[str, ...] = ()) -> Linear:
    """A function computing ``x @ weight.T`` for ``x`` ``[tokens, in]`` of ``dtype``; returns ``[tokens, out]``.

    ``names``: the model's parameters stacked into ``weight`` (unused here; a factory of another
    weight format may look their source up, e.g. the GGUF's own Q4_1 blocks).
    ``weight`` is ``[out, in]``, float32 (or any float dtype), and is not modified.  bfloat16 on a CPU
    with oneDNN's bf16 linear (:func:`~inference.packed.onednn_linear_available`) uses a weight reordered
    once into oneDNN's blocked layout (faster than plain ``F.linear`` there, see
    :mod:`inference.packed`); everything else is ``F.linear`` on ``weight`` converted to ``dtype`` (no
    copy when it already is, so a tied output layer shares the embedding's memory in float32).
    """
    if dtype == torch.bfloat16 and weight.device.type == "cpu" and onednn_linear_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype).contiguous(), PACKED_BATCH_HINT)
        pointwise = torch.ops.mkldnn._linear_pointwise.default

        def packed_linear(x: torch.Tensor) -> torch.Tensor:
            return pointwise(x, packed, None, "none", [], "")

        return packed_linear
    converted = weight.detach().to(dtype).contiguous()

    def linear(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, converted)

    return linear


def supports(model) -> bool:
    """Whether :class:`LlamaModelRunner` can run ``model``; :func:`unsupported_reason` says why not."""
    return unsupported_reason(model) is None


@dataclass(kw_only=True)
class _Layer(LlamaLayer):
    """A decoder layer as the runner runs it.  ``o`` and ``down`` are only ever added into the
    residual stream in place: with float32 activations they are the formats' ``compute`` (see
    _residual_linear), whose output may be bfloat16."""

    # residual += o(x) and residual += down(x) in place (see _residual_add): the fused decode step's.
    o_add: Callable[[torch.Tensor, torch.Tensor], None]
    down_add: Callable[[torch.Tensor, torch.Tensor], None]
    products: tuple[Linear, Linear, Linear, Linear]  # qkv, o, gate_up, down as the factory built them
    rope_index: int = 0  # which of the runner's rotary tables the layer reads


@dataclass
class _Partial:
    """A waiting request's cache: ``length`` positions of ``keys``/``values`` ``[layers, kv_heads, capacity, head_dim]``.

    ``shared``: the tensors are a stored prompt's (:meth:`LlamaModelRunner.reuse_prefix`), read but
    never written: the first chunk copies them into a cache of the request's own.
    """

    length: int
    keys: torch.Tensor
    values: torch.Tensor
    token_ids: list[int] = field(default_factory=list)  # the ``length`` prompt tokens cached
    shared: bool = False


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch's operations on one thread inside (restored after), for a prefill's elementwise work
    (rotary embeddings, cache writes and casts): on two threads each operation wakes an OpenMP thread
    that sleeps again at once, and took longer (docs/performance.md#the-llama-runners-prefill).
    Attention and the products keep every thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _address(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def _rounds_input_to_bfloat16(linear: Linear, rows: int) -> bool:
    """Whether ``linear`` rounds an input of ``rows`` rows to bfloat16 anyway (see
    :meth:`inference.weights.WeightLinear.rounds_input_to_bfloat16`); False for a plain callable."""
    rounds = getattr(linear, "rounds_input_to_bfloat16", None)
    return rounds is not None and rounds(rows)


def _round_up(value: int, chunk: int) -> int:
    return -(-value // chunk) * chunk


def soft_capped_attention(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, softcap: float
) -> torch.Tensor:
    """Attention with scores soft-capped before the softmax (Gemma 2: ``tanh(s / cap) * cap``),
    in torch's operations (SDPA and our prefill kernel cannot cap): ``queries`` ``[..., q, dim]``,
    ``keys``/``values`` ``[..., k, dim]`` broadcast against them, ``mask`` boolean broadcast to
    ``[..., q, k]`` (True: attend) or None; scores scaled by ``dim ** -0.5`` (queries carry any
    other scale), softmax in float32 as transformers' eager attention; returns ``[..., q, dim]``."""
    scores = torch.matmul(queries, keys.transpose(-1, -2)) * queries.shape[-1] ** -0.5
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(queries.dtype)
    return torch.matmul(weights, values)


class LlamaModelRunner:
    """The ModelRunner (:mod:`inference.model_runner`) for Llama-family models, forward pass our own.

    ``model``: the weights, :class:`inference.families.llama.LlamaWeights` (a GGUF file's, from
    :func:`~inference.families.llama.gguf_weights`), or a loaded transformers Llama causal LM, on the
    CPU or one device, unchanged by the runner (read through ``linear_factory``,
    :func:`~inference.families.llama.transformers_weights`).  Its q/k/v and gate/up weights are copied into stacked matrices; the others are shared
    with it where ``make_linear`` keeps them as they are (float32 into float32), so an engine that
    keeps only the runner should drop the model's decoder layers, or their memory counts twice.  ``dtype``:
    the activation dtype (float32 or bfloat16).  ``kv_cache_dtype``: the KV cache's (vLLM's
    ``kv_cache_dtype``): None is ``dtype``; ``auto`` is float16 where the fused decode step runs (our
    kernels read and write float16 caches, converting to float32 in registers; llama.cpp's default
    cache type, half the memory of float32) and ``dtype`` elsewhere; or a floating ``torch.dtype``.  ``linear_factory``: what builds every
    linear layer, :func:`make_linear` or another with its signature (a ``description`` attribute,
    if it has one, goes into :attr:`description`).  ``max_batch_size``: the batch sizes
    :meth:`warm_up` runs (1 to it).  ``prefix_cache_bytes``: the budget of the prefix cache
    (:mod:`inference.prefix_cache`, see :meth:`reuse_prefix`), shared with the running rows:
    stored prompts keep only what the rows' positions do not use; 0 turns it off.  Raises
    ``ValueError`` when :func:`unsupported_reason` names a reason.  Not thread-safe: one worker thread calls it, under ``torch.inference_mode``.
    """

    # The running batch's cache, set by reset_batch and _reallocate.
    _layer_keys: list[torch.Tensor]
    _layer_values: list[torch.Tensor]
    _row_capacity: int
    _column_capacity: int
    _lengths: list[int]
    _cache_addresses: torch.Tensor
    # A prefill's group of new prompts of one size (see _group_partials), None outside one.
    _group_keys: torch.Tensor | None
    _group_values: torch.Tensor | None

    def __init__(
        self,
        model,
        dtype: torch.dtype = torch.float32,
        linear_factory: LinearFactory = make_linear,
        max_batch_size: int = 32,
        kernels: CPUKernels | None | str = "auto",
        kv_cache_dtype: torch.dtype | str | None = None,
        prefix_cache_bytes: int = 0,
    ) -> None:
        weights = model if isinstance(model, LlamaWeights) else transformers_weights(model, dtype, linear_factory)
        config = weights.config
        self.dtype = dtype
        self.max_batch_size = max_batch_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.eps = float(config.rms_norm_eps)
        self.num_layers = config.num_hidden_layers
        self.max_context = served_context(config)  # longrope: the context its short factors serve
        self.vocab_size = weights.vocab_size
        self.device = weights.final_norm.device
        self._embedding = weights.embedding
        if weights.embedding_rows is not None:
            self._embedding_rows = weights.embedding_rows
        # Rotary tables: the model's first, then each other rope a layer has (Gemma 3's local layers').
        self._ropes = [(weights.inv_freq.to(self.device), weights.rope_scaling)]
        rope_of: dict[int, int] = {}
        for layer in weights.layers:
            if layer.rope is not None and id(layer.rope) not in rope_of:
                rope_of[id(layer.rope)] = len(self._ropes)
                self._ropes.append((layer.rope[0].to(self.device), layer.rope[1]))
        self._layers = [
            self._load_layer(layer, 0 if layer.rope is None else rope_of[id(layer.rope)]) for layer in weights.layers
        ]
        self._smallest_window = min((layer.window for layer in self._layers if layer.window), default=None)
        self._hidden_act = weights.hidden_act
        self._embedding_scale = weights.embedding_scale
        self._final_softcap = weights.final_logit_softcapping
        # Queries are multiplied by this so that every attention path's head_dim ** -0.5 gives the
        # model's scale (Gemma's query_pre_attn_scalar ** -0.5); rope is linear, so before or after it.
        scale = weights.attention_scale
        self._query_scale = None if scale is None or scale == self.head_dim**-0.5 else scale * self.head_dim**0.5
        # Our prefill attention kernel cannot soft-cap scores (Gemma 2's): such layers prefill in torch's operations.
        self._prefill_kernel_attention = all(layer.attention_softcap is None for layer in self._layers)
        # The whole decode step in one kernel call takes one rotary table and one soft-cap for all
        # layers: not Gemma 3's local and global rotary bases.
        self._one_call_layers = len(self._ropes) == 1 and len({layer.attention_softcap for layer in self._layers}) == 1
        self._final_norm = weights.final_norm
        self._lm_head = weights.lm_head
        empty = torch.empty(0, self.head_dim, dtype=dtype, device=self.device)
        self._cos_tables, self._sin_tables = [empty] * len(self._ropes), [empty] * len(self._ropes)
        linear_kind = (
            "oneDNN-packed bfloat16"
            if dtype == torch.bfloat16 and onednn_linear_available()
            else str(dtype).removeprefix("torch.")
        )
        if isinstance(model, LlamaWeights) or linear_factory is not make_linear:
            linear_kind = weights.description
        self.description = f"llama runner, weights {linear_kind}, activations {str(dtype).removeprefix('torch.')}"
        self.weight_formats = linear_kind
        self._partials: dict[int, _Partial] = {}
        self.prefix_cache_bytes = prefix_cache_bytes
        self._prefix_cache = PrefixCache(prefix_cache_bytes)
        # The whole-step tables (see _whole_step_table): per row count, and per set of weights.
        self._table_at: dict[int, torch.Tensor | None] = {}
        self._step_tables: dict[tuple[int, ...], torch.Tensor] = {}
        self._kernels = self._fused_decode_kernels(kernels)
        if kv_cache_dtype is None:
            kv_cache_dtype = dtype
        elif kv_cache_dtype == "auto":
            kv_cache_dtype = torch.float16 if self._kernels is not None else dtype
        if not isinstance(kv_cache_dtype, torch.dtype) or not kv_cache_dtype.is_floating_point:
            raise ValueError(f"kv_cache_dtype must be auto or a floating torch.dtype, not {kv_cache_dtype!r}")
        self.kv_dtype = kv_cache_dtype
        if self._kernels is not None and self.kv_dtype not in (torch.float32, torch.float16):
            self._kernels = None  # our attention reads float32 and float16 caches only
        if self._kernels is not None:
            self.description += ", fused decode ops"
        if self.kv_dtype != dtype:
            self.description += f", {str(self.kv_dtype).removeprefix('torch.')} KV cache"
        self.reset()

    def _fused_decode_kernels(self, kernels: CPUKernels | None | str) -> CPUKernels | None:
        """Our CPU kernels for the decode step (:mod:`inference.cpu_kernels`), or None for torch's operations.

        ``"auto"``: loaded (built at the first use) when the runner computes in float32 on the CPU
        with an even ``head_dim`` of at most 256, else None; a :class:`CPUKernels` is used as given
        under the same conditions; None turns them off.
        """
        fits = self.dtype == torch.float32 and self.device.type == "cpu" and self.head_dim % 2 == 0
        if kernels is None or not fits or self.head_dim > 256:
            return None
        if isinstance(kernels, str):
            from .cpu_kernels import load

            return load(None)
        return kernels

    # --- weights ---------------------------------------------------------------------------------

    def _load_layer(self, layer: LlamaLayer, rope_index: int) -> _Layer:
        return _Layer(
            input_norm=layer.input_norm,
            qkv=layer.qkv,
            o=self._residual_linear(layer.o),
            post_norm=layer.post_norm,
            gate_up=layer.gate_up,
            down=self._residual_linear(layer.down),
            o_add=self._residual_add(layer.o),
            down_add=self._residual_add(layer.down),
            products=(layer.qkv, layer.o, layer.gate_up, layer.down),
            qkv_bias=layer.qkv_bias,
            q_norm=layer.q_norm,
            k_norm=layer.k_norm,
            window=layer.window,
            attention_output_norm=layer.attention_output_norm,
            mlp_output_norm=layer.mlp_output_norm,
            attention_softcap=layer.attention_softcap,
            rope_index=rope_index,
        )

    def _residual_linear(self, linear: Linear) -> Linear:
        """What computes a linear whose output is only added into the float32 residual stream in place.

        A format computing in bfloat16 (int4, int8, bfloat16; :meth:`inference.weights.WeightLinear.compute`)
        then returns its bfloat16 result as it is: ``x += y`` converts ``y`` exactly as ``y.float()``
        would, without that call's allocation and copy (60 per decode step of the embedded model).
        Other activation dtypes, and linears without ``compute``, keep the linear itself.
        """
        if self.dtype != torch.float32:
            return linear
        return getattr(linear, "compute", linear)

    def _residual_add(self, linear: Linear) -> Callable[[torch.Tensor, torch.Tensor], None]:
        """``add(x, residual)``: ``residual += linear(x)`` in place; a format's own ``add_into`` where
        it has one (:meth:`inference.weights.WeightLinear.add_into`: our kernels accumulate without a
        temporary)."""
        add_into = getattr(linear, "add_into", None)
        if add_into is not None:
            return add_into
        compute = self._residual_linear(linear)

        def add(x: torch.Tensor, residual: torch.Tensor) -> None:
            residual += compute(x)

        return add

    @property
    def _cos(self) -> torch.Tensor:
        """The model's cos table ``[positions, head_dim]`` (see :meth:`_rope_table`)."""
        return self._cos_tables[0]

    @property
    def _sin(self) -> torch.Tensor:
        return self._sin_tables[0]

    @property
    def _rope_scaling(self) -> float:
        """The model's cos/sin scale (longrope's attention factor; 1 for most ropes)."""
        return self._ropes[0][1]

    def _rope_table(self, positions: int) -> None:
        """Make the cos/sin tables (one per rope of :attr:`_ropes`) cover ``positions`` positions (in
        chunks, up to ``max_context``).

        Rows are ``[head_dim]``: cos is transformers' ``cat(freqs, freqs).cos()``; sin has its first
        half negated, so that ``x * cos + swap_halves(x) * sin`` is ``x * cos + rotate_half(x) * sin``.
        """
        if positions <= self._cos.shape[0]:
            return
        if positions > self.max_context:
            raise ValueError(f"position {positions - 1} is past the model's context of {self.max_context}")
        size = min(self.max_context, _round_up(positions, ROPE_TABLE_CHUNK))
        for index, (inv_freq, scaling) in enumerate(self._ropes):
            freqs = torch.arange(size, device=self.device).float()[:, None] * inv_freq  # as transformers: in float32
            angles = torch.cat((freqs, freqs), dim=-1)
            cos = angles.cos() * scaling
            sin = angles.sin() * scaling
            sin[:, : self.head_dim // 2].neg_()
            self._cos_tables[index], self._sin_tables[index] = cos.to(self.dtype), sin.to(self.dtype)

    def _rope_rows(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per rotary table, the rows ``(cos, sin)`` ``[tokens, 1, head_dim]`` of ``positions`` ``[tokens]``."""
        return [
            (cos[positions][:, None], sin[positions][:, None]) for cos, sin in zip(self._cos_tables, self._sin_tables)
        ]

    # --- the forward pass ------------------------------------------------------------------------

    def _rotate(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embeddings of queries and keys together: ``qk`` ``[tokens, heads, head_dim]`` (any
        strides), ``cos``/``sin`` ``[tokens, 1, head_dim]``; returns a new contiguous tensor."""
        tokens, heads, dim = qk.shape
        swapped = qk.unflatten(-1, (2, dim // 2)).flip(-2).view(tokens, heads, dim)
        return torch.addcmul(qk * cos, swapped, sin)

    def _qkv(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        """Queries, keys and values ``[tokens, (heads + 2 kv_heads) * head_dim]`` (a new contiguous
        tensor) of normed hidden states ``x`` ``[tokens, hidden]``: the stacked product, its bias,
        and each query and key head's RMSNorm (Qwen3's, before rope), in place."""
        qkv = layer.qkv(x)
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias
        if layer.q_norm is not None:
            heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
            qk = qkv[:, : (heads + kv_heads) * dim].unflatten(-1, (heads + kv_heads, dim))
            qk[:, :heads] = F.rms_norm(qk[:, :heads], (dim,), layer.q_norm, self.eps)
            qk[:, heads:] = F.rms_norm(qk[:, heads:], (dim,), layer.k_norm, self.eps)
        if self._query_scale is not None:
            qkv[:, : self.num_heads * self.head_dim] *= self._query_scale
        return qkv

    def _past_window(self, positions: int) -> bool:
        """Whether a query among the first ``positions`` positions sees past a layer's window (so
        the prefill and whole-step kernels, which attend to every earlier position, cannot run it)."""
        return self._smallest_window is not None and positions > self._smallest_window

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings ``[tokens, hidden]`` of ``ids`` ``[tokens]``: a new tensor (a residual stream)."""
        x = self._embedding_rows(ids) if self._embedding is None else F.embedding(ids, self._embedding)
        if self._embedding_scale is not None:  # in the activations' dtype, as transformers' Gemma
            x *= torch.tensor(self._embedding_scale, dtype=x.dtype)
        return x

    @property
    def embedding_is_own(self) -> bool:
        """Whether the runner reads its embeddings from weights of its own, not the model's embedding
        parameter (which an engine that keeps only the runner may then drop)."""
        return self._embedding is None

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU (Shazeer 2020) ``down(silu(gate(x)) * up(x))`` or GeGLU (Gemma's, gelu's tanh
        form) of normed ``x`` ``[tokens, hidden]``, its output norm applied where the layer has one."""
        gate_up = layer.gate_up(F.rms_norm(x, (self.hidden_size,), layer.post_norm, self.eps))
        return self._output_norm(layer.down(self._gated(gate_up)), layer.mlp_output_norm)

    def _gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``act(gate) * up`` of ``gate_up`` ``[tokens, 2 * intermediate]``: our SiLU or GELU kernel
        where the fused decode ops run (float32 or bfloat16, in its dtype), else torch's SiLU or
        tanh-approximated GELU."""
        if self._kernels is not None:
            return self._kernels.silu_mul(gate_up) if self._hidden_act == "silu" else self._kernels.gelu_mul(gate_up)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        if self._hidden_act == "silu":
            return F.silu(gate) * up
        return F.gelu(gate, approximate="tanh") * up

    def _output_norm(self, y: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """``y`` ``[tokens, hidden]`` (an attention's or MLP's output) through its RMSNorm, if any."""
        if weight is None:
            return y
        return F.rms_norm(y.to(weight.dtype), (self.hidden_size,), weight, self.eps)

    def _attention_add(self, layer: _Layer, attended: torch.Tensor, x: torch.Tensor) -> None:
        """``x += o(attended)`` in place, through the layer's attention output norm where it has one."""
        if layer.attention_output_norm is None:
            layer.o_add(attended, x)
        else:
            x += self._output_norm(layer.products[1](attended), layer.attention_output_norm)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm of ``x`` ``[tokens, hidden]`` with scales ``weight``: our kernel's one call where
        the fused decode ops run (float32), else torch's."""
        if self._kernels is not None:
            return self._kernels.rms_norm(x, weight, self.eps)
        return F.rms_norm(x, (self.hidden_size,), weight, self.eps)

    def _mlp_add(self, layer: _Layer, x: torch.Tensor) -> None:
        """``x += _mlp(layer, x)`` in place, with our SiLU-times-up kernel where the fused decode ops run."""
        if self._kernels is None:
            x += self._mlp(layer, x)
            return
        # The product's own dtype (bfloat16 for a long chunk's bfloat16 product): our GLU kernel takes
        # it and gives the same, which the down product takes as it is where it rounds its input to
        # bfloat16 anyway; another down (a file's F16 or Q8_0 tensor), or another dtype, gets it in float32.
        gate_up = getattr(layer.gate_up, "compute", layer.gate_up)(self._norm(x, layer.post_norm))
        bfloat16_down = gate_up.dtype == torch.bfloat16 and _rounds_input_to_bfloat16(layer.products[3], x.shape[0])
        if gate_up.dtype != torch.float32 and not bfloat16_down:
            gate_up = gate_up.float()
        gated = self._gated(gate_up)
        if layer.mlp_output_norm is None:
            layer.down_add(gated, x)
        else:
            x += self._output_norm(layer.down(gated), layer.mlp_output_norm)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[tokens, vocab]`` of final hidden states ``[tokens, hidden]``, soft-capped
        where the model says so (Gemma's ``final_logit_softcapping``)."""
        if self._kernels is not None and hidden.dtype == torch.float32 and self._final_norm.dtype == torch.float32:
            # One call: after a decode step's weights have flushed the caches each torch operation
            # costs tens of microseconds (docs/performance.md#a-steps-python).
            normed = self._kernels.rms_norm(hidden.contiguous(), self._final_norm, self.eps)
        else:
            normed = F.rms_norm(hidden, (self.hidden_size,), self._final_norm, self.eps)
        logits = self._lm_head(normed).float()
        if self._final_softcap is not None:
            logits = torch.tanh(logits / self._final_softcap) * self._final_softcap
        return logits

    def prefill(self, chunks: Sequence[PrefillChunk]) -> list[torch.Tensor]:
        """One forward pass over ``chunks`` (see the seam); returns float32 logits per chunk,
        ``[len(token_ids), vocab]`` if ``all_logits`` else ``[1, vocab]``.

        A chunk with ``start == 0`` begins a new cache for its key (replacing any); one with
        ``start > 0`` continues the key's cache, which must hold exactly ``start`` positions.
        Raises ``ValueError`` for an empty chunk, a ``start`` that does not match, two chunks of one
        key, or positions past ``max_context``; the caches are then unchanged.
        """
        if not chunks:
            return []
        chunk_keys = [chunk.key for chunk in chunks]
        if len(set(chunk_keys)) != len(chunk_keys):
            raise ValueError("two chunks of one request in one prefill")
        for chunk in chunks:
            if not chunk.token_ids:
                raise ValueError("a prefill chunk has no tokens")
            cached = self._partials[chunk.key].length if chunk.key in self._partials else 0
            if chunk.start != 0 and chunk.start != cached:
                raise ValueError(f"chunk starts at {chunk.start} but {cached} positions are cached for it")
        end = max(chunk.start + len(chunk.token_ids) for chunk in chunks)
        self._rope_table(end)
        # New prompts of one size (many short requests at once) go first, as one group: their
        # caches are views of one buffer and each layer's cache writes and attention are one call
        # for the group, not one per prompt (docs/performance.md#the-llama-runners-prefill).
        given = chunks
        order, group = self._prefill_order(chunks)
        chunks = [given[i] for i in order]
        partials = self._group_partials(chunks[:group]) + [self._partial_for(chunk) for chunk in chunks[group:]]
        group_size = len(chunks[0].token_ids) if group else 0
        group_rows = group * group_size
        ids = torch.tensor([token for chunk in chunks for token in chunk.token_ids], device=self.device)
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        qk_width = (heads + kv_heads) * dim
        x = self._embed(ids)  # [tokens, hidden]
        tokens = x.shape[0]
        fits = self._prefill_attention_fits() and self._prefill_kernel_attention and not self._past_window(end)
        tables = self._prefill_tables(chunks, partials) if fits else None
        if tables is None:
            # Each chunk's attention in blocks of ATTENTION_QUERIES queries: (first, end, mask) per
            # block, for each of the layers' windows.
            blocks_of = {
                window: [self._attention_blocks(chunk.start, len(chunk.token_ids), window) for chunk in chunks]
                for window in {layer.window for layer in self._layers}
            }
            positions = torch.cat(
                [torch.arange(chunk.start, chunk.start + len(chunk.token_ids), device=self.device) for chunk in chunks]
            )
            rope_rows = self._rope_rows(positions)
        for index, layer in enumerate(self._layers):
            qkv = self._qkv(layer, self._norm(x, layer.input_norm))
            if tables is not None:  # one call: rotary embeddings, cache writes, attention
                assert self._kernels is not None, "tables are built for the kernels only"
                attended = torch.empty(tokens, heads * dim, dtype=x.dtype, device=self.device)
                cos_table, sin_table = self._cos_tables[layer.rope_index], self._sin_tables[layer.rope_index]
                if not self._kernels.prefill_attention(
                    qkv.contiguous(), tables[index], heads, kv_heads, cos_table, sin_table, self.kv_dtype, attended
                ):
                    raise RuntimeError("the prefill attention kernel declined a layer _prefill_attention_fits admitted")
                self._attention_add(layer, attended, x)
                self._mlp_add(layer, x)
                continue
            blocks = blocks_of[layer.window]
            cos, sin = rope_rows[layer.rope_index]
            with _one_thread():  # rotary embeddings, cache writes, attention's float32 keys and values
                qk = self._rotate(qkv[:, :qk_width].view(tokens, heads + kv_heads, dim), cos, sin)
                values = qkv[:, qk_width:].view(tokens, kv_heads, dim)
                # Per attention call (the group's, then each chunk's): queries, keys, values ([n, heads
                # or kv_heads, positions, dim]), the positions cached before it, its blocks.
                calls = []
                if group:
                    assert self._group_keys is not None and self._group_values is not None, "set for the group"
                    size = group_size
                    cache_keys, cache_values = (
                        self._group_keys[:, index],
                        self._group_values[:, index],
                    )  # [n, kv_heads, capacity, dim]
                    cache_keys[:, :, :size] = qk[:group_rows, heads:].view(group, size, kv_heads, dim).transpose(1, 2)
                    cache_values[:, :, :size] = values[:group_rows].view(group, size, kv_heads, dim).transpose(1, 2)
                    queries = qk[:group_rows, :heads].view(group, size, heads, dim).transpose(1, 2)
                    keys, cached_values = cache_keys[:, :, :size].to(x.dtype), cache_values[:, :, :size].to(x.dtype)
                    calls.append((queries, keys, cached_values, 0, blocks[0]))  # new prompts of one size
                offset = group_rows
                for chunk, partial, chunk_blocks in zip(chunks[group:], partials[group:], blocks[group:]):
                    size, start = len(chunk.token_ids), chunk.start
                    rows = slice(offset, offset + size)
                    cache_keys, cache_values = partial.keys[index], partial.values[index]  # [kv_heads, capacity, dim]
                    cache_keys[:, start : start + size] = qk[rows, heads:].transpose(0, 1)
                    cache_values[:, start : start + size] = values[rows].transpose(0, 1)
                    keys = cache_keys[None, :, : start + size].to(x.dtype)
                    cached_values = cache_values[None, :, : start + size].to(x.dtype)
                    calls.append((qk[rows, :heads].transpose(0, 1)[None], keys, cached_values, start, chunk_blocks))
                    offset += size
            outputs = [self._attend(*call, layer.attention_softcap) for call in calls]  # [n, heads, size, dim] each
            with _one_thread():  # each call's rows in order
                attended = torch.cat([output.transpose(1, 2).reshape(-1, heads * dim) for output in outputs])
            self._attention_add(layer, attended, x)
            self._mlp_add(layer, x)
        wanted, offset = [], 0
        for chunk in chunks:
            size = len(chunk.token_ids)
            wanted.append(
                torch.arange(offset, offset + size) if chunk.all_logits else torch.tensor([offset + size - 1])
            )
            offset += size
        logits = self._logits(x[torch.cat(wanted).to(self.device)])
        self._group_keys = self._group_values = None
        for chunk, partial in zip(chunks, partials):
            partial.length = chunk.start + len(chunk.token_ids)
            partial.token_ids[chunk.start :] = chunk.token_ids
            self._partials[chunk.key] = partial
        pieces = logits.split([len(rows) for rows in wanted])
        result: list[torch.Tensor] = [None] * len(pieces)  # type: ignore[list-item]  # order fills every place below
        for place, piece in zip(order, pieces):
            result[place] = piece
        return result

    def _prefill_attention_fits(self) -> bool:
        """Whether a prefill's attention runs in :meth:`CPUKernels.prefill_attention` (our kernels, a
        head size of 64, 96 (Phi-3), 128 or 256 (Gemma), whole groups of query heads) rather than in
        torch's operations."""
        return (
            self._kernels is not None
            and self.head_dim in (64, 96, 128, 256)
            and self.num_heads % self.num_kv_heads == 0
        )

    def _prefill_tables(self, chunks: Sequence[PrefillChunk], partials: Sequence[_Partial]) -> torch.Tensor | None:
        """The sequences' table of :meth:`CPUKernels.prefill_attention` per layer, int64 ``[layers,
        len(chunks), 6]``: rows in the pass's order (the group's first), their caches' addresses
        layer by layer (each cache ``[layers, kv_heads, capacity, dim]``, a view of the group's
        buffer for the group's); None where a cache's positions are not contiguous rows."""
        rows, layer_steps, offset = [], [], 0
        for chunk, partial in zip(chunks, partials):
            keys, values = partial.keys, partial.values  # [layers, kv_heads, capacity, dim] views
            if keys.stride()[2:] != (self.head_dim, 1) or values.stride() != keys.stride():
                return None
            size = len(chunk.token_ids)
            rows.append([offset, size, chunk.start, keys.stride(1), keys.data_ptr(), values.data_ptr()])
            layer_steps.append(
                [0, 0, 0, 0, keys.stride(0) * keys.element_size(), values.stride(0) * values.element_size()]
            )
            offset += size
        base, step = torch.tensor(rows, dtype=torch.int64), torch.tensor(layer_steps, dtype=torch.int64)
        return base + torch.arange(self.num_layers, dtype=torch.int64)[:, None, None] * step

    @staticmethod
    def _prefill_order(chunks: Sequence[PrefillChunk]) -> tuple[list[int], int]:
        """The order to run ``chunks`` in and how many lead it as a group: the new prompts
        (``start == 0``) of the most common size, when two or more share it; the others follow in
        their given order."""
        sizes = collections.Counter(len(chunk.token_ids) for chunk in chunks if chunk.start == 0)
        size, count = sizes.most_common(1)[0] if sizes else (0, 0)
        if count < 2:
            return list(range(len(chunks))), 0
        first = [i for i, chunk in enumerate(chunks) if chunk.start == 0 and len(chunk.token_ids) == size]
        chosen = set(first)
        return first + [i for i in range(len(chunks)) if i not in chosen], len(first)

    def _group_partials(self, chunks: Sequence[PrefillChunk]) -> list[_Partial]:
        """New caches for a group of new prompts of one size: views of one buffer per keys and values
        (``self._group_keys``/``_values``, ``[n, layers, kv_heads, capacity, head_dim]``, kept for this pass)."""
        if not chunks:
            self._group_keys = self._group_values = None
            return []
        capacity = _round_up(len(chunks[0].token_ids), COLUMN_CHUNK)
        shape = (len(chunks), self.num_layers, self.num_kv_heads, capacity, self.head_dim)
        self._group_keys = torch.empty(shape, dtype=self.kv_dtype, device=self.device)
        self._group_values = torch.empty(shape, dtype=self.kv_dtype, device=self.device)
        return [_Partial(0, self._group_keys[i], self._group_values[i]) for i in range(len(chunks))]

    @staticmethod
    def _attend(
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        start: int,
        blocks: list[tuple[int, int, torch.Tensor | None]],
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Attention of ``queries`` ``[n, heads, size, dim]`` over ``keys``/``values`` ``[n, kv_heads,
        start + size, dim]`` (``start`` positions cached before the queries), in the
        :meth:`_attention_blocks` ``blocks`` of the queries, each on every thread, scores
        soft-capped at ``softcap`` if given; ``[n, heads, size, dim]``."""
        if softcap is not None:
            n, heads, size, dim = queries.shape
            kv_heads = keys.shape[1]
            grouped = queries.view(n, kv_heads, heads // kv_heads, size, dim)  # a KV head's query heads
            outputs = []
            for first, end, mask in blocks:
                if mask is None:  # a block at position 0: plain causal
                    mask = torch.ones(end, end, dtype=torch.bool, device=queries.device).tril()
                out = soft_capped_attention(
                    grouped[:, :, :, first:end],
                    keys[:, :, None, : start + end],
                    values[:, :, None, : start + end],
                    mask,
                    softcap,
                )
                outputs.append(out.reshape(n, heads, end - first, dim))
        else:
            outputs = [
                F.scaled_dot_product_attention(
                    queries[:, :, first:end],
                    keys[:, :, : start + end],
                    values[:, :, : start + end],
                    attn_mask=mask,
                    is_causal=mask is None,
                    enable_gqa=True,
                )
                for first, end, mask in blocks
            ]
        if len(outputs) == 1:
            return outputs[0]
        with _one_thread():
            return torch.cat(outputs, dim=2)

    def _attention_blocks(
        self, start: int, size: int, window: int | None = None
    ) -> list[tuple[int, int, torch.Tensor | None]]:
        """A chunk's attention calls: ``(first, end, mask)`` per block of at most
        :data:`ATTENTION_QUERIES` of its queries ``[first, end)`` (``start`` positions are cached
        before it), which attend to positions ``0 .. start + end``, or to the last ``window`` of
        them; ``mask`` boolean ``[end - first, start + end]`` (True: attend), or None (SDPA's own
        causal mask) for a block at position 0 that no window cuts."""
        result = []
        for first in range(0, size, ATTENTION_QUERIES):
            end = min(size, first + ATTENTION_QUERIES)
            cut = window is not None and start + end > window
            mask = None
            if start + first or cut:
                columns = torch.arange(start + end, device=self.device)[None, :]
                queries = (start + first + torch.arange(end - first, device=self.device))[:, None]
                mask = columns <= queries
                if cut:
                    assert window is not None, "only a window cuts"
                    mask &= columns > queries - window
            result.append((first, end, mask))
        return result

    def _partial_for(self, chunk: PrefillChunk) -> _Partial:
        """The key's cache with room for the chunk (a copy when it must grow; new at ``start == 0``)."""
        needed = chunk.start + len(chunk.token_ids)
        partial = self._partials.get(chunk.key) if chunk.start else None
        if partial is not None and not partial.shared and needed <= partial.keys.shape[2]:
            return partial
        capacity = _round_up(needed, COLUMN_CHUNK)
        shape = (self.num_layers, self.num_kv_heads, capacity, self.head_dim)
        # Empty is safe: attention reads only the positions a chunk has written.
        grown = _Partial(
            0,
            torch.empty(shape, dtype=self.kv_dtype, device=self.device),
            torch.empty(shape, dtype=self.kv_dtype, device=self.device),
        )
        if partial is not None:
            grown.keys[:, :, : partial.length] = partial.keys[:, :, : partial.length]
            grown.values[:, :, : partial.length] = partial.values[:, :, : partial.length]
            grown.length = partial.length
            grown.token_ids = partial.token_ids
        return grown

    def reuse_prefix(self, key: int, token_ids: Sequence[int]) -> int:
        """Take the longest prefix of prompt ``token_ids`` that the prefix cache holds (a prompt
        prefilled before; :mod:`inference.prefix_cache`) as ``key``'s first positions, leaving at
        least the last token to compute (its logits give the first sampled token).

        Returns how many positions are reused (0: none, or the cache is off); the key's first
        prefill chunk must then start there, or :meth:`join` takes them as they are (a prompt cached
        but for its last token, which the next decode step feeds).  The positions are copied at that
        chunk or join, so a waiting request holds no memory of its own.  For a request whose prompt log-probabilities are
        wanted, do not call it: they need every position's logits (vLLM skips the cache for them too).
        """
        if not self.prefix_cache_bytes or len(token_ids) < 2 or key in self._partials:
            return 0
        found = self._prefix_cache.lookup(token_ids)
        if found is None:
            return 0
        stored, length = found
        length = min(length, len(token_ids) - 1)
        self._partials[key] = _Partial(length, stored.keys, stored.values, list(stored.token_ids[:length]), shared=True)
        return length

    @property
    def prefix_epoch(self) -> int:
        """Changes whenever the prefix cache stores a prompt (a waiting request may then look again)."""
        return self._prefix_cache.stores

    def _store_prompt(self, partial: _Partial) -> None:
        """Keep a wholly prefilled prompt's cache in the prefix cache (its used columns, copied)."""
        if not self.prefix_cache_bytes or partial.length < 2 or partial.shared:
            return
        self._fit_prefix_cache()
        length = partial.length
        keys, values = self._copy_columns(partial.keys[:, :, :length], partial.values[:, :, :length])
        self._prefix_cache.store(partial.token_ids[:length], keys, values)

    def _copy_columns(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous copies of views ``keys``/``values`` ``[layers, kv_heads, length, head_dim]`` of a
        cache: our kernels' row copy, one call for both (faster than torch's strided clone of a float16
        cache: docs/performance.md#the-llama-runners-prefill), else torch's clone."""
        if self._kernels is not None and keys.device.type == "cpu":
            copies = torch.empty_like(keys, memory_format=torch.contiguous_format)
            value_copies = torch.empty_like(copies)
            starts = torch.arange(self.num_layers, dtype=torch.int64) * (copies[0].numel() * copies.element_size())
            targets = torch.cat([starts + copies.data_ptr(), starts + value_copies.data_ptr()])
            if self._kernels.copy_cache_rows(targets, keys.shape[2], 0, 1, keys, values, keys.shape[2]):
                return copies, value_copies
        return keys.clone(), values.clone()

    def _fit_prefix_cache(self) -> None:
        """Shrink the prefix cache to what the running rows' positions leave of the budget (as
        vLLM's cached blocks live in the KV blocks that running sequences do not hold)."""
        if self.prefix_cache_bytes:
            per_position = 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype.itemsize
            self._prefix_cache.shrink(max(0, self.prefix_cache_bytes - sum(self._lengths) * per_position))

    def decode(self, input_ids: Sequence[int]) -> torch.Tensor:
        """One step for every running row: ``input_ids[b]`` goes at row ``b``'s next position.

        Returns float32 logits ``[B, vocab]``.  Raises ``ValueError`` when ``len(input_ids)`` is not
        the number of running rows or a row would pass ``max_context`` (nothing changes then).
        """
        rows = len(self._lengths)
        if len(input_ids) != rows:
            raise ValueError(f"{len(input_ids)} input ids for {rows} running rows")
        if rows == 0:
            return torch.empty(0, self.vocab_size, device=self.device)
        longest = max(self._lengths) + 1
        self._rope_table(longest)
        self._reserve(rows, longest)
        positions = torch.tensor(self._lengths, device=self.device)
        if self._kernels is not None:
            # The whole-step kernel attends to every earlier position: not past a window.
            whole_step = self._one_call_layers and not self._past_window(longest)
            table = self._whole_step_table(rows) if whole_step else None
            if table is not None:
                hidden = self._embed(torch.tensor(input_ids))
                self._kernels.decode_layers(
                    hidden, table, self.num_heads, self.num_kv_heads, self.intermediate_size, self.eps,
                    self._cos, self._sin, positions, self._layer_keys[0],
                    scale=self.head_dim**-0.5 * (self._query_scale or 1.0),
                    softcap=self._layers[0].attention_softcap, gelu=self._hidden_act != "silu",
                )  # fmt: skip
            else:
                hidden = self._decode_layers_fused(torch.tensor(input_ids), positions)
            self._lengths = [length + 1 for length in self._lengths]
            return self._logits(hidden)
        kv_heads, capacity = self.num_kv_heads, self._column_capacity
        # Where each row's new key goes in a layer's cache seen as [rows * kv_heads * capacity, dim].
        slots = (
            torch.arange(rows * kv_heads, device=self.device).view(rows, kv_heads) * capacity + positions[:, None]
        ).view(-1)
        columns = torch.arange(longest, device=self.device)[None, :]
        masks: dict[int | None, torch.Tensor | None] = {}
        for window in {layer.window for layer in self._layers}:
            mask = None
            if min(self._lengths) + 1 != longest:  # rows of one length attend to every column: no mask
                mask = columns <= positions[:, None]
            if window is not None and longest > window:
                mask = (columns <= positions[:, None]) & (columns > positions[:, None] - window)
            masks[window] = None if mask is None else mask.view(rows, 1, 1, longest)
        ids = torch.tensor(input_ids, device=self.device)
        logits = self._logits(self._decode_layers(ids, self._rope_rows(positions), slots, masks, longest))
        self._lengths = [length + 1 for length in self._lengths]
        return logits

    def _decode_layers(
        self,
        ids: torch.Tensor,
        rope_rows: list[tuple[torch.Tensor, torch.Tensor]],
        slots: torch.Tensor,
        masks: dict[int | None, torch.Tensor | None],
        longest: int,
    ) -> torch.Tensor:
        """The decode step's tensor work: ``ids`` ``[rows]``, per rotary table ``(cos, sin)`` ``[rows, 1, head_dim]``,
        ``slots`` ``[rows * kv_heads]`` (where each new key goes, see :meth:`decode`), ``masks``
        per layer window ``[rows, 1, 1, longest]`` or None; writes the caches, returns the last layer's hidden states ``[rows, hidden]``."""
        rows = ids.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        group = heads // kv_heads
        qk_width = (heads + kv_heads) * dim
        x = self._embed(ids)  # [rows, hidden]
        for index, layer in enumerate(self._layers):
            qkv = self._qkv(layer, self._norm(x, layer.input_norm))
            qk = self._rotate(qkv[:, :qk_width].view(rows, heads + kv_heads, dim), *rope_rows[layer.rope_index])
            cache_keys, cache_values = (
                self._layer_keys[index],
                self._layer_values[index],
            )  # [row capacity, kv_heads, capacity, dim]
            cache_keys.view(-1, dim).index_copy_(
                0, slots, qk[:, heads:].reshape(rows * kv_heads, dim).to(self.kv_dtype)
            )
            cache_values.view(-1, dim).index_copy_(
                0, slots, qkv[:, qk_width:].reshape(rows * kv_heads, dim).to(self.kv_dtype)
            )
            # Grouped-query attention: the `group` query heads of one KV head are its `group` queries.
            queries = qk[:, :heads].view(rows, kv_heads, group, dim)
            keys, values = cache_keys[:rows, :, :longest].to(x.dtype), cache_values[:rows, :, :longest].to(x.dtype)
            if layer.attention_softcap is None:
                attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=masks[layer.window])
            else:
                attended = soft_capped_attention(queries, keys, values, masks[layer.window], layer.attention_softcap)
            # attended: [rows, kv_heads, group, dim]
            self._attention_add(layer, attended.reshape(rows, heads * dim), x)
            x += self._mlp(layer, x)
        return x

    def _decode_layers_fused(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`_decode_layers` with our kernels: per layer two RMSNorms, the attention (rotary
        embeddings, cache writes, attention over each row's own length: no mask) and SiLU times up
        are one call each, and the o and down products add into the residual stream in place.
        ``ids``/``positions`` int64 ``[rows]``; returns the last layer's hidden states ``[rows, hidden]``."""
        kernels, eps = self._kernels, self.eps
        assert kernels is not None
        x = self._embed(ids)  # [rows, hidden], a new tensor: the residual stream
        for index, layer in enumerate(self._layers):
            qkv = self._qkv(layer, kernels.rms_norm(x, layer.input_norm, eps))
            attended = kernels.decode_attention(
                qkv,
                self.num_heads,
                self.num_kv_heads,
                self._cos_tables[layer.rope_index],
                self._sin_tables[layer.rope_index],
                positions,
                self._layer_keys[index],
                self._layer_values[index],
                layer.window,
                layer.attention_softcap,
            )
            self._attention_add(layer, attended, x)
            self._mlp_add(layer, x)
        return x

    def _whole_step_table(self, rows: int) -> torch.Tensor | None:
        """The table of :meth:`inference.cpu_kernels.CPUKernels.decode_layers` for a step of ``rows``
        rows, when every layer's four products run our block kernels at that row count
        (:meth:`inference.weights.WeightLinear.step_parts`), else None.  Built once per plan;
        :meth:`_reallocate` keeps its cache columns on the buffers."""
        if rows not in self._table_at:
            self._table_at[rows] = None
            fields: list[list[int]] = []
            for layer in self._layers:
                products = [getattr(linear, "step_parts", lambda _: None)(rows) for linear in layer.products]
                if any(parts is None or len(parts) > STEP_PARTS for parts in products):
                    return None
                row = [
                    *(_address(t) for t in (layer.input_norm, layer.post_norm, layer.q_norm, layer.k_norm)),
                    _address(layer.qkv_bias),
                    0,  # the key and value caches: _point_at_caches
                    0,
                    layer.window or 0,
                    _address(layer.attention_output_norm),
                    _address(layer.mlp_output_norm),
                ]
                for parts in products:
                    assert parts is not None
                    padded = [field for part in parts for field in part]
                    row += padded + [0] * (STEP_PARTS * 5 - len(padded))
                fields.append(row)
            key = tuple(field for row in fields for field in row)
            if key not in self._step_tables:
                table = torch.tensor(fields, dtype=torch.int64)
                assert table.shape[1] == STEP_TABLE_FIELDS
                self._step_tables[key] = table
                self._point_at_caches(table)
            self._table_at[rows] = self._step_tables[key]
        return self._table_at[rows]

    def _point_at_caches(self, table: torch.Tensor) -> None:
        """A whole-step table's cache columns: the addresses of the running batch's buffers."""
        if self._layer_keys:
            table[:, 5] = torch.tensor([keys.data_ptr() for keys in self._layer_keys])
            table[:, 6] = torch.tensor([values.data_ptr() for values in self._layer_values])

    # --- the running batch's cache ----------------------------------------------------------------

    def _reserve(self, rows: int, columns: int) -> None:
        """Make the batch cache hold ``rows`` rows of ``columns`` positions, growing by whole chunks of
        rows and by at least doubling its columns (up to the model's context), so that a sequence's
        growth costs a number of copies logarithmic in its length; unused capacity costs address
        space only (:func:`inference.memory.zeroed`)."""
        if rows <= self._row_capacity and columns <= self._column_capacity:
            return
        column_capacity = self._column_capacity
        if columns > column_capacity:
            longest = _round_up(self.max_context, COLUMN_CHUNK)
            column_capacity = max(_round_up(columns, COLUMN_CHUNK), min(2 * column_capacity, longest))
        self._reallocate(
            max(self._row_capacity, _round_up(rows, ROW_CHUNK)), column_capacity, list(range(len(self._lengths)))
        )

    def _reallocate(self, row_capacity: int, column_capacity: int, sources: list[int]) -> None:
        """New batch buffers of this capacity, holding the current rows ``sources`` as rows 0..k-1.

        One layer at a time, each old buffer dropped once copied, so growing never holds two whole
        caches (at 32 rows of 512 positions that would be 0.4 GB more at the peak, in bfloat16).
        Zero-filled: masked columns meet zero attention weights, and stale memory could hold NaN.
        Fresh mappings (:func:`inference.memory.zeroed`): only the copied positions are written here,
        and the rest is mapped as decode steps write it.
        """
        shape = (row_capacity, self.num_kv_heads, column_capacity, self.head_dim)
        used = max((self._lengths[row] for row in sources), default=0)
        self._fit_prefix_cache()  # stored prompts give way to the running rows before the batch grows
        index = torch.tensor(sources, dtype=torch.long, device=self.device)
        for buffers in (self._layer_keys, self._layer_values):
            for layer in range(self.num_layers):
                buffer = memory.zeroed(shape, self.kv_dtype, self.device)
                if layer < len(buffers):
                    if sources:
                        buffer[: len(sources), :, :used] = buffers[layer][index, :, :used]
                    buffers[layer] = buffer
                else:
                    buffers.append(buffer)
        self._row_capacity, self._column_capacity = row_capacity, column_capacity
        # The buffers' addresses, keys then values, for our kernels' row copy (_append_rows).
        self._cache_addresses = torch.tensor(
            [buffer.data_ptr() for buffer in (*self._layer_keys, *self._layer_values)], dtype=torch.int64
        )
        for table in self._step_tables.values():
            self._point_at_caches(table)

    def join(self, key: int, copies: int) -> None:
        """Append ``copies`` rows holding the prefilled cache of ``key`` (or the positions
        :meth:`reuse_prefix` found for it), which is then forgotten.

        ``copies == 0`` (every candidate finished on its first token) only forgets ``key``, as the
        seam allows.  Raises ``KeyError`` for a key with no prefilled cache, ``ValueError`` for
        ``copies < 0``.
        """
        if copies < 0:
            raise ValueError("copies must not be negative")
        partial = self._partials.pop(key)
        self._append_rows(partial, copies)
        self._store_prompt(partial)

    def _append_rows(self, partial: _Partial, copies: int) -> None:
        """Append ``copies`` rows holding ``partial``'s ``length`` positions."""
        if copies == 0:
            return
        rows, length = len(self._lengths), partial.length
        self._reserve(rows + copies, length + 1)
        if (
            self._kernels is not None
            and partial.keys.dtype == self.kv_dtype
            and partial.keys.device.type == "cpu"
            and self._kernels.copy_cache_rows(
                self._cache_addresses, self._column_capacity, rows, copies, partial.keys, partial.values, length
            )
        ):
            self._lengths.extend([length] * copies)
            return
        new = slice(rows, rows + copies)
        # One call for every layer (torch's foreach copy): the engine's thread takes the GIL back
        # once, not once per layer, which under many short requests cost a switch interval each.
        targets = [buffer[new, :, :length] for buffer in (*self._layer_keys, *self._layer_values)]
        sources = [
            cache[layer, None, :, :length].expand(copies, -1, -1, -1)
            for cache in (partial.keys, partial.values)
            for layer in range(self.num_layers)
        ]
        torch._foreach_copy_(targets, sources)
        self._lengths.extend([length] * copies)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep running rows ``rows`` in this order; only rows whose place changes are copied.

        The buffers shrink when what is kept fills less than a quarter of them; when nothing is
        kept they stay for the next rows (a batch that empties and fills again at every step, as
        under many one-token requests, would reallocate them each time) until :meth:`free_batch`.  Raises ``IndexError`` for a row that is not running, ``ValueError`` for a
        repeated row.
        """
        rows = list(rows)
        if any(not 0 <= row < len(self._lengths) for row in rows):
            raise IndexError(f"rows {rows} are not all among {len(self._lengths)} running rows")
        if len(set(rows)) != len(rows):
            raise ValueError(f"rows {rows} repeat a row")
        lengths = [self._lengths[row] for row in rows]
        if not rows:
            self._lengths = []
            return
        row_capacity, column_capacity = _round_up(len(rows), ROW_CHUNK), _round_up(max(lengths) + 1, COLUMN_CHUNK)
        if 4 * row_capacity * column_capacity <= self._row_capacity * self._column_capacity:
            self._reallocate(row_capacity, column_capacity, rows)
        else:
            moves = [(place, row) for place, row in enumerate(rows) if place != row]
            if moves:
                used = max(lengths)
                places = torch.tensor([place for place, _ in moves], device=self.device)
                sources = torch.tensor([row for _, row in moves], device=self.device)
                # Indexing with `sources` copies them first, so a row may move onto another that also moves.
                for buffer in (*self._layer_keys, *self._layer_values):
                    buffer[places, :, :used] = buffer[sources, :, :used]
        self._lengths = lengths

    def release(self, key: int) -> None:
        """Forget a waiting request's partial cache; harmless if unknown."""
        self._partials.pop(key, None)

    def reset(self) -> None:
        """Drop every cache: the running batch's, the waiting requests' and the stored prompts'."""
        self.reset_batch()
        self._partials.clear()
        self._prefix_cache.clear()

    def free_batch(self) -> None:
        """Give the buffers of an empty running batch back to the allocator (the engine, when idle);
        nothing while rows run."""
        if not self._lengths:
            self.reset_batch()

    def reset_batch(self) -> None:
        """Drop the running batch's cache (its memory goes back to the allocator)."""
        self._layer_keys = []  # per layer [row capacity, kv_heads, column capacity, head_dim]
        self._layer_values = []
        self._row_capacity = self._column_capacity = 0
        self._lengths = []  # positions cached per running row
        self._cache_addresses = torch.empty(0, dtype=torch.int64)  # see _reallocate

    @property
    def cache_bytes(self) -> int:
        """Bytes held by the running batch's cache, the waiting requests' and the stored prompts'."""
        tensors = [*self._layer_keys, *self._layer_values]
        tensors += [t for p in self._partials.values() if not p.shared for t in (p.keys, p.values)]
        return sum(t.numel() * t.element_size() for t in tensors) + self._prefix_cache.nbytes

    @property
    def lengths(self) -> list[int]:
        """Positions cached per running row (a copy)."""
        return list(self._lengths)

    def warm_up(self) -> None:
        """Run decode at batch sizes 1, 2, 4, ... up to ``max_batch_size``, a prefill batch, a continued
        chunk and prompt logits once, then drop the caches, so the kernels (oneDNN's primitives are
        made per shape) and the allocator have seen each kind of step before the first request.
        Must not run while requests are in flight (it resets)."""
        self.reset()
        sizes = sorted({min(2**power, self.max_batch_size) for power in range(self.max_batch_size.bit_length() + 1)})
        with torch.inference_mode():
            prompt = [min(token, self.vocab_size - 1) for token in range(1, 33)]
            self.prefill([PrefillChunk(-1, prompt, 0, False), PrefillChunk(-2, prompt[:5], 0, True)])
            self.prefill([PrefillChunk(-1, prompt[:7], len(prompt), True)])
            self.join(-1, self.max_batch_size)
            self.release(-2)
            for rows in reversed(sizes):
                self.keep(range(rows))
                self.decode([1] * rows)
        self.reset()
