"""Weight formats for the model's linear layers, and the load-time autotune that picks them.

A model runner builds each linear layer through :func:`make_linear` (or a :class:`Choice`'s
factories): a float32 weight ``[out_features, in_features]`` goes in, a callable
``x [..., in_features] -> [..., out_features]`` comes out, in the activations' own dtype.  The
formats:

- ``float32``: ``F.linear`` on the weight as given (exact).
- ``bfloat16``: the weight in bfloat16, reordered once into oneDNN's blocked layout
  (:class:`inference.packed.PackedLinear`); only where oneDNN has a bf16 path on this CPU
  (AVX-512 BW/VL/DQ or AVX-NE-CONVERT), i.e. not under ``ONEDNN_MAX_CPU_ISA=AVX2``.
- ``int8``: weight-only int8 with one symmetric scale per output channel,
  ``torch._weight_int8pack_mm``.
- ``int4``: weight-only 4-bit in groups of 32 along ``in_features`` with a scale and a zero per
  group, ``torch.ops.aten._weight_int4pack_mm_for_cpu``.  Built from the embedded GGUF's own Q4_1
  blocks (:func:`read_q4_1_blocks`) it reproduces the shipped weights up to the rounding of the
  scales to the kernel's dtype; built from float32 weights it quantizes them the way Q4_1 does.

The quantized kernels run in bfloat16 activations whatever dtype the caller's are (a cast on the way
in and out): with float32 or float16 activations they were many times slower
(docs/performance.md#weight-formats-model_weights).

:func:`choose_formats` times the formats this CPU supports on the model's shapes at batches of 1, 8
and 32 rows, turns the timings into a :class:`Plan` per role (the decoder layers; the output layer),
logs it and caches it as JSON under ``.cache/`` keyed by CPU model, torch's CPU capability, torch
version, thread count and shapes.  A layer holding several formats dispatches on the row count of
each call (:class:`PlannedLinear`).  No Django here: the setting ``MODEL_WEIGHTS`` reaches
:func:`choose_formats` as ``requested`` through ``ModelConfig.weights``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from .packed import PackedLinear

if TYPE_CHECKING:
    from .cpu_kernels import CPUKernels

logger = logging.getLogger(__name__)

FORMATS = ("float32", "bfloat16", "int8", "int4", "q4_1", "q8_0")
WEIGHTS_CHOICES = ("auto", *FORMATS)

# The dtype each quantized kernel computes in (see the module docstring for the measurements).
QUANTIZED_COMPUTE_DTYPE = torch.bfloat16

# Formats ``auto`` may pick: none of torch's quantized ones diverged from float32's greedy text less
# often than bfloat16 (docs/performance.md#weight-formats-model_weights); int8 and int4 stay available
# by name (MODEL_WEIGHTS) and as ``candidates``.
AUTO_FORMATS = ("float32", "bfloat16")

# The usual winners first (bench/weight_formats.py): see choose_formats.
TIMING_ORDER = ("q4_1", "q8_0", "bfloat16", "int4", "int8", "float32")

INT4_GROUP = 32
# innerKTiles of torch's int4 CPU packing: the only value its CPU kernel takes besides 2 and 4;
# the layout is an implementation detail of the kernel, 8 matching the CUDA one.
INT4_INNER_K_TILES = 8


def _kernel(name: str) -> Callable[..., torch.Tensor]:
    """``torch.<name>``, the C binding of an aten kernel: faster per call than through
    ``torch.ops.aten``, with no Python frame or name lookup (docs/performance.md#why-our-own-kernels).
    In a torch build without it, a function raising ``NotImplementedError`` when called,
    so that :func:`_format_works` finds the format unsupported instead of this module failing to import."""
    kernel = getattr(torch, name, None)
    if kernel is not None:
        return kernel

    def missing(*args, **kwargs):
        raise NotImplementedError(f"this torch build has no torch.{name}")

    return missing


_INT8_MM = _kernel("_weight_int8pack_mm")
_INT4_MM = _kernel("_weight_int4pack_mm_for_cpu")

# The embedded model's shapes as a runner with fused projections computes them, per decoder layer:
# q/k/v fused (576 + 192 + 192 rows), the attention output, gate/up fused, the MLP down projection.
EMBEDDED_LAYER_SHAPES: tuple[tuple[int, int], ...] = ((960, 576), (576, 576), (3072, 576), (576, 1536))
EMBEDDED_LAYERS = 30
EMBEDDED_OUTPUT_SHAPE = (49152, 576)
BATCH_SIZES = (1, 8, 32)

# Linear weights of one format, or two, must fit this (bytes), so that a process serving 32 streams
# of 512-token contexts stays under 1.2 GB: a float32 copy of the embedded model's linears alone is
# 538 MB, and a second copy next to it is not worth the memory unless it fits.
DEFAULT_MEMORY_BUDGET = 600 * 2**20

AUTOTUNE_VERSION = 5  # 3: plans prefer formats fast at more batch sizes (NEAR_FASTEST); 4: within the budget;
# 5: the bfloat16 prefill is timed, not assumed


# --- Support on this CPU -----------------------------------------------------------------------------


def cpu_capability() -> str:
    """What torch's CPU kernels dispatch to here (``"AVX512"``, ``"AVX2"``, ...); follows ``ATEN_CPU_CAPABILITY``."""
    return str(torch.backends.cpu.get_cpu_capability())


@functools.cache
def _format_works(name: str, capability: str) -> bool:
    # ``capability`` is part of the cache key only: support can change with ATEN_CPU_CAPABILITY.
    weight = torch.randn(16, 64)
    x = torch.randn(2, 64)
    try:
        with torch.inference_mode():
            out = _BUILDERS[name](weight, None)(x)
        # Loose on purpose: this asks whether the kernel runs here, not how exact it is (the tests do).
        expected = x @ weight.T
        return out.shape == expected.shape and bool((out - expected).norm() < 0.2 * expected.norm())
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def supported_formats() -> tuple[str, ...]:
    """The formats of :data:`FORMATS` that run on this CPU with this torch build (a tiny trial each)."""
    capability = cpu_capability()
    return tuple(name for name in FORMATS if name == "float32" or _format_works(name, capability))


def check_format(name: str) -> str:
    """Return ``name`` if it is a format this CPU runs; raise ``ValueError`` saying why otherwise."""
    if name not in FORMATS:
        raise ValueError(f"weight format must be one of {', '.join(WEIGHTS_CHOICES)}, not {name!r}")
    if name not in supported_formats():
        raise ValueError(
            f"weight format {name!r} is not supported on this CPU (torch capability {cpu_capability()}, "
            f"torch {torch.__version__}); supported: {', '.join(supported_formats())}"
        )
    return name


# --- The linear layers ---------------------------------------------------------------------------------

# A product's part in the whole-step table (WeightLinear.step_parts): csrc/decode_ops.cpp's PartKind.
StepPart = tuple[int, int, int, int, int]
STEP_Q4_1, STEP_Q8_0, STEP_GGML = 1, 2, 3


class WeightLinear:
    """Base of the formats: ``y = x W^T + b`` for ``x [..., in_features]``, in ``x``'s dtype.

    ``nbytes``: what the layer holds in memory (weights, scales, bias).
    """

    format: str = ""
    in_features: int
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b`` in the dtype the format computes in (bfloat16 for bfloat16, int8 and int4
        activations), not converted back to ``x``'s: for a caller that adds it into a float32 tensor
        in place, which converts it exactly, one aten call fewer (the Llama runner's residual adds)."""
        return self(x)

    def rounds_input_to_bfloat16(self, rows: int) -> bool:
        """Whether a product of ``rows`` rows rounds ``x`` to bfloat16 whatever its dtype (so that a
        caller may hand it bfloat16 at no loss: the Llama runner's GLU output into down)."""
        return False

    def add_into(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """``residual += x W^T + b`` in place, ``x`` ``[rows, in]``, ``residual`` float32 ``[rows, out]``
        (a residual stream); formats with a kernel that accumulates do it without a temporary."""
        residual += self.compute(x)

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor | None:
        """Rows ``ids`` (int64 ``[n]``) of the weight as float32 ``[n, in_features]``, where the format
        keeps it exactly enough to serve as a tied embedding (Q8_0 blocks converted from a GGUF: see
        :func:`is_lossless_q8_0`); None for the others."""
        return None

    def step_parts(self, rows: int) -> list[StepPart] | None:
        """What a product of ``rows`` rows runs, for a caller that runs our kernels itself (the Llama
        runner's whole-step call, :meth:`inference.cpu_kernels.CPUKernels.decode_layers`): parts whose
        outputs lie side by side, each ``(kind, operand, operand, operand, out_features)`` with the
        operands' addresses (:class:`StepPart`); None where the product is not a plain kernel call on
        stored blocks at that row count (a bias, bfloat16 weights, torch's product)."""
        return None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors() if t is not None)

    def _tensors(self) -> Iterable[torch.Tensor | None]:
        return ()


class Float32Linear(WeightLinear):
    """``F.linear`` on a float32 weight ``[out, in]``; exact.  Other activation dtypes are cast to float32 and back."""

    format = "float32"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.weight = weight.detach().float().contiguous()
        self.bias = None if bias is None else bias.detach().float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.linear(x, self.weight, self.bias)
        return self.compute(x).to(x.dtype)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight, self.bias)

    def _tensors(self):
        return (self.weight, self.bias)


class Bfloat16Linear(WeightLinear):
    """The weight in bfloat16, prepacked by oneDNN (:class:`PackedLinear`); activations cast to bfloat16.

    Raises ``RuntimeError`` from oneDNN where the CPU has no bf16 path (:func:`check_format` says so first).
    """

    format = "bfloat16"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.packed = PackedLinear(
            weight.detach().to(torch.bfloat16), None if bias is None else bias.detach().to(torch.bfloat16)
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # forward, not the module's __call__: its hook checks cost a few microseconds per layer.
        if x.dtype == torch.bfloat16:
            return self.packed.forward(x)
        return self.packed.forward(x.to(torch.bfloat16)).to(x.dtype)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed.forward(x.to(torch.bfloat16))

    def rounds_input_to_bfloat16(self, rows: int) -> bool:
        return True

    @property
    def nbytes(self) -> int:
        # The packed weight is an opaque oneDNN tensor; its size is that of the bf16 weight.
        bias = self.packed.bias
        return self.out_features * self.in_features * 2 + (0 if bias is None else bias.numel() * bias.element_size())


class Int8Linear(WeightLinear):
    """Weight-only int8, symmetric, one scale per output channel: ``W ≈ scale[n] * q[n, k]``, ``q`` in [-127, 127].

    Computes with ``torch._weight_int8pack_mm`` in ``compute_dtype`` (bfloat16 by default; the scales
    are stored in it); the bias is added in float32 terms after.  Error per weight at most ``scale / 2``
    plus the scale's rounding to ``compute_dtype``.
    """

    format = "int8"

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        compute_dtype: torch.dtype = QUANTIZED_COMPUTE_DTYPE,
    ) -> None:
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        self.qweight = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
        self.compute_dtype = compute_dtype
        self.scales = scale.to(compute_dtype)
        self.bias = None if bias is None else bias.detach().to(compute_dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # A 2-d x (every call of the Llama runner) skips the two reshapes: at batch 1 each aten call
        # costs about as much as a small layer's product.
        return self.compute(x).to(x.dtype)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        out = _INT8_MM(flat.to(self.compute_dtype), self.qweight, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)

    def rounds_input_to_bfloat16(self, rows: int) -> bool:
        return self.compute_dtype == torch.bfloat16

    @classmethod
    def from_quantized(
        cls,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None = None,
        compute_dtype: torch.dtype = QUANTIZED_COMPUTE_DTYPE,
    ) -> Int8Linear:
        """The layer of int8 values ``qweight [out, in]`` and per-row ``scales [out]``, as they are."""
        layer = cls.__new__(cls)
        layer.out_features, layer.in_features = qweight.shape
        layer.qweight, layer.compute_dtype = qweight.contiguous(), compute_dtype
        layer.scales = scales.to(compute_dtype)
        layer.bias = None if bias is None else bias.detach().to(compute_dtype)
        return layer

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` this layer computes with (scales as stored)."""
        return self.qweight.float() * self.scales.float()[:, None]

    def _tensors(self):
        return (self.qweight, self.scales, self.bias)


@dataclass(frozen=True)
class Q4_1Blocks:
    """4-bit values with a scale and a minimum per group of 32, as GGUF's Q4_1 stores them.

    ``q``: ``[out, in]`` uint8 in 0..15; ``d`` and ``m``: ``[out, in / 32]`` float16.  The weight is
    ``d * q + m`` per group (ggml's ``dequantize_row_q4_1``).
    """

    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]  # q is 2-D: [out, in]

    def dequantize(self) -> torch.Tensor:
        """The float32 weight ``[out, in]``: ``d * q + m`` computed in float32, as gguf-py and transformers do."""
        out, inp = self.q.shape
        groups = self.q.reshape(out, inp // INT4_GROUP, INT4_GROUP).float()
        return (self.d.float()[..., None] * groups + self.m.float()[..., None]).reshape(out, inp)

    @staticmethod
    def cat(blocks: Sequence[Q4_1Blocks]) -> Q4_1Blocks:
        """Stack several weights' blocks along the output rows (fused projections)."""
        return Q4_1Blocks(*(torch.cat([getattr(b, name) for b in blocks]) for name in ("q", "d", "m")))

    def rows(self, index: torch.Tensor) -> Q4_1Blocks:
        """The blocks of the output rows ``index`` (a permutation, for q/k's GGUF row order)."""
        return Q4_1Blocks(self.q[index], self.d[index], self.m[index])


def quantize_q4_1(weight: torch.Tensor) -> Q4_1Blocks:
    """Quantize a float32 ``[out, in]`` weight (``in`` a multiple of 32) the way ggml's Q4_1 does.

    Per group of 32: ``m = min``, ``d = (max - min) / 15``, ``q = round((x - min) / d)`` clamped to 0..15,
    ``d`` and ``m`` stored as float16.  Raises ``ValueError`` when ``in`` is not a multiple of 32.
    """
    out, inp = weight.shape
    if inp % INT4_GROUP:
        raise ValueError(f"int4 needs in_features divisible by {INT4_GROUP}, got {inp}")
    groups = weight.detach().float().reshape(out, inp // INT4_GROUP, INT4_GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    d = (high - low) / 15
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.floor((groups - low[..., None]) * inverse[..., None] + 0.5).clamp_(0, 15).to(torch.uint8)
    return Q4_1Blocks(q.reshape(out, inp), d.half(), low.half())


class Int4Linear(WeightLinear):
    """Weight-only 4-bit in groups of 32, torch's CPU int4 kernel: ``W = (q - 8) * scale + zero`` per group.

    Built from :class:`Q4_1Blocks` with ``scale = d`` and ``zero = m + 8 d`` (so that
    ``(q - 8) d + m + 8 d = d q + m``), the two rounded to ``compute_dtype`` once, in float32.
    ``from_float`` quantizes a float32 weight as Q4_1 does first.  ``in_features`` must be a
    multiple of 32 and ``out_features`` of 16 (the kernel's packing), else ``ValueError``.
    """

    format = "int4"

    def __init__(
        self, blocks: Q4_1Blocks, bias: torch.Tensor | None = None, compute_dtype: torch.dtype = QUANTIZED_COMPUTE_DTYPE
    ) -> None:
        self.out_features, self.in_features = blocks.shape
        if self.in_features % INT4_GROUP or self.out_features % 16:
            raise ValueError(
                f"int4 needs in_features divisible by {INT4_GROUP} and out_features by 16, "
                f"got {self.out_features} x {self.in_features}"
            )
        self.compute_dtype = compute_dtype
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            blocks.q.to(torch.int32).contiguous(), INT4_INNER_K_TILES
        )
        d, m = blocks.d.float(), blocks.m.float()
        # The kernel wants [in / 32, out, 2] (scale, zero).
        self.scales_and_zeros = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous().to(compute_dtype)
        self.bias = None if bias is None else bias.detach().to(compute_dtype)
        self._q: torch.Tensor | None = blocks.q  # kept only for dequantized(); dropped by release_debug_copy()

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, **kwargs) -> Int4Linear:
        return cls(quantize_q4_1(weight), bias, **kwargs)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.compute(x).to(x.dtype)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # see Int8Linear.__call__
        out = _INT4_MM(flat.to(self.compute_dtype), self.packed, INT4_GROUP, self.scales_and_zeros)
        if self.bias is not None:
            out = out + self.bias
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)

    def rounds_input_to_bfloat16(self, rows: int) -> bool:
        return self.compute_dtype == torch.bfloat16

    def dequantized(self) -> torch.Tensor:
        """The float64 weight ``[out, in]`` the kernel computes with: ``(q - 8) * scale + zero`` (stored values)."""
        if self._q is None:
            raise RuntimeError("the unpacked values were released")
        sz = self.scales_and_zeros.double().transpose(0, 1)  # [out, in/32, 2]
        groups = self._q.reshape(self.out_features, -1, INT4_GROUP).double() - 8
        return (groups * sz[..., :1] + sz[..., 1:]).reshape(self.out_features, self.in_features)

    def release_debug_copy(self) -> None:
        """Drop the unpacked 4-bit values (half the packed size again) once no one needs ``dequantized``."""
        self._q = None

    def _tensors(self):
        return (self.packed, self.scales_and_zeros, self.bias)


class _BlockLinear(WeightLinear):
    """What the block formats of our kernels share: float32 products, ``x``'s dtype from ``__call__``,
    and accumulation into a residual in place.  A subclass gives ``_product(x, out=None)`` (the
    kernel; ``out`` given: added into).  Every row count runs the kernel, a prompt's prefill too: its
    16-bit products of many rows beat MKL's sgemm of a dequantized weight (``set_activation_bits``;
    docs/performance.md#why-our-own-kernels)."""

    kernels: CPUKernels
    bias: torch.Tensor | None
    # From this many rows on (a long prefill chunk), the product runs in bfloat16 on a bfloat16 copy
    # of the weight made for that call (:meth:`_bfloat16_weight`): None, never (see Q4_1Linear).
    bfloat16_rows: int | None = None

    def _product(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _bfloat16_weight(self) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _in_bfloat16(self, rows: int) -> bool:
        # Not where the products were put on their AVX2 code (set_avx512(False)): as an AVX2 CPU.
        return self.bfloat16_rows is not None and rows >= self.bfloat16_rows and self.kernels.avx512

    def rounds_input_to_bfloat16(self, rows: int) -> bool:
        return self._in_bfloat16(rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.compute(x)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 ``x W^T + b``, or bfloat16 where the product runs in bfloat16 (a long prefill
        chunk) and there is no bias; ``x`` float32, or bfloat16 (a bfloat16 product's output, then
        widened where the product is not in bfloat16)."""
        self._check_width(x)
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self._in_bfloat16(flat.shape[0]):
            out = F.linear(flat.to(torch.bfloat16), self._bfloat16_weight())
            if self.bias is not None:
                out = out.float() + self.bias
        else:
            out = self._product(flat.float())
            if self.bias is not None:
                out += self.bias
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)

    def add_into(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        # Our kernels add float32 into a contiguous float32 buffer: another residual (bfloat16
        # activations) or a bfloat16 product takes it through torch instead.
        rows = x.shape[0]
        if (
            residual.dtype != torch.float32
            or not residual.is_contiguous()
            or x.dim() != 2
            or x.dtype != torch.float32
            or self._in_bfloat16(rows)
        ):
            residual += self.compute(x)
            return
        self._check_width(x)
        if self.bias is not None:
            residual += self.bias
        self._product(x, out=residual)

    def _check_width(self, x: torch.Tensor) -> None:
        # Our kernels take K from x: a wrong width would read past the weight, where F.linear raises.
        if x.shape[-1] != self.in_features:
            raise RuntimeError(f"input of width {x.shape[-1]} for a layer of {self.in_features} input features")


class Q4_1Linear(_BlockLinear):
    """GGUF's Q4_1 blocks as they are (``w = d q + m`` per group of 32, ``d``/``m`` in float32),
    multiplied in float32 activations by our kernel (:mod:`inference.cpu_kernels`; on the AVX2 code
    rounded to 16 bits per group of 32 at one row and from 5 rows on: ``set_activation_bits``).

    Built from a GGUF's own blocks it computes the float32 model's products up to summation order
    and that rounding (no rounding of scales, no bfloat16 activations: what ``auto`` may pick
    without a quality cost, bench/activation_bits_quality.py);
    ``from_float`` quantizes a float32 weight as Q4_1 does first.  Output float32, or ``x``'s dtype
    from ``__call__``.  Raises ``NotImplementedError`` where the kernels cannot run here,
    ``ValueError`` when ``in_features`` is not a multiple of 32.
    """

    format = "q4_1"

    def __init__(self, blocks: Q4_1Blocks, bias: torch.Tensor | None = None) -> None:
        self.kernels = _cpu_kernels()
        self.out_features, self.in_features = blocks.shape
        if self.in_features % INT4_GROUP:
            raise ValueError(f"q4_1 needs in_features divisible by {INT4_GROUP}, got {self.in_features}")
        self.qs = _pack_nibbles(blocks.q).contiguous()
        self.d, self.m = blocks.d.float().contiguous(), blocks.m.float().contiguous()
        self.bias = None if bias is None else bias.detach().float()

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Q4_1Linear:
        return cls(quantize_q4_1(weight), bias)

    @classmethod
    def from_parts(
        cls, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Q4_1Linear:
        """The layer of packed nibbles ``qs`` ``[out, in / 2]`` (Q4_1's byte order) and float32 ``d``/``m``
        ``[out, in / 32]`` as they are (:func:`inference.formats.ggml.q4_1_parts`)."""
        layer = cls.__new__(cls)
        layer.kernels = _cpu_kernels()
        layer.out_features, layer.in_features = d.shape[0], d.shape[1] * INT4_GROUP
        layer.qs, layer.d, layer.m = qs.contiguous(), d.float().contiguous(), m.float().contiguous()
        layer.bias = None if bias is None else bias.detach().float()
        return layer

    def _product(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.kernels.q4_1(x, self.qs, self.d, self.m, out=out)

    def _bfloat16_weight(self) -> torch.Tensor:
        return self.kernels.q4_1_to_bfloat16(self.qs, self.d, self.m)

    def step_parts(self, rows: int) -> list[StepPart] | None:
        if self.bias is not None or self._in_bfloat16(rows):
            return None
        return [(STEP_Q4_1, self.qs.data_ptr(), self.d.data_ptr(), self.m.data_ptr(), self.out_features)]

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` this layer computes with."""
        groups = _unpack_nibbles(self.qs).reshape(self.out_features, -1, INT4_GROUP).float()
        return (groups * self.d[..., None] + self.m[..., None]).reshape(self.out_features, self.in_features)

    def _tensors(self):
        return (self.qs, self.d, self.m, self.bias)


def quantize_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a float32 ``[out, in]`` weight the way ggml's Q8_0 does: per group of 32,
    ``d = max |w| / 127`` and ``q = round(w / d)``; returns ``(q`` int8 ``[out, in]``, ``d`` float32 ``[out, in / 32])``.

    The scales stay float32 (ggml rounds them to float16), so a weight dequantized from Q8_0 blocks
    comes back as it was.  Raises ``ValueError`` when ``in`` is not a multiple of 32.
    """
    out, inp = weight.shape
    if inp % INT4_GROUP:
        raise ValueError(f"q8_0 needs in_features divisible by {INT4_GROUP}, got {inp}")
    groups = weight.detach().float().reshape(out, inp // INT4_GROUP, INT4_GROUP)
    d = groups.abs().amax(-1) / 127
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round(groups * inverse[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(out, inp).contiguous(), d.contiguous()


class Q8_0Linear(_BlockLinear):
    """GGUF's Q8_0 (``w = d q`` per group of 32, ``q`` int8, ``d`` float32), multiplied in float32
    activations by our kernel (:mod:`inference.cpu_kernels`; on the AVX2 code rounded to 16 bits per
    group of 32 at one row and from 5 rows on: ``set_activation_bits``).

    The embedded GGUF keeps its embedding (the tied output layer) as Q8_0: quantizing the float32
    weight converted from it gives its blocks back (:func:`is_lossless_q8_0` checks).  Raises
    ``NotImplementedError`` where the kernels cannot run here, ``ValueError`` when ``in_features``
    is not a multiple of 32.
    """

    format = "q8_0"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.kernels = _cpu_kernels()
        self.out_features, self.in_features = weight.shape
        self.q, self.d = quantize_q8_0(weight)
        self.bias = None if bias is None else bias.detach().float()
        self.lossless = _holds_exactly(weight, self.q, self.d)  # an embedding may be read from it

    @classmethod
    def from_parts(cls, q: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None = None) -> Q8_0Linear:
        """The layer of int8 values ``q`` ``[out, in]`` and float32 scales ``d`` ``[out, in / 32]`` as
        they are (a GGUF's Q8_0 blocks, :func:`inference.formats.ggml.q8_0_parts`): its rows serve as
        an embedding."""
        layer = cls.__new__(cls)
        layer.kernels = _cpu_kernels()
        layer.out_features, layer.in_features = q.shape
        layer.q, layer.d = q.contiguous(), d.float().contiguous()
        layer.bias = None if bias is None else bias.detach().float()
        layer.lossless = True
        return layer

    def _product(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.kernels.q8_0(x, self.q, self.d, out=out)

    def step_parts(self, rows: int) -> list[StepPart] | None:
        if self.bias is not None or self._in_bfloat16(rows):
            return None
        return [(STEP_Q8_0, self.q.data_ptr(), self.d.data_ptr(), 0, self.out_features)]

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor | None:
        if not self.lossless:
            return None
        return _q8_0_values(self.q[ids], self.d[ids])

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` this layer computes with."""
        return _q8_0_values(self.q, self.d)

    def _tensors(self):
        return (self.q, self.d, self.bias)


def is_lossless_q8_0(weight: torch.Tensor, relative_tolerance: float = 1e-6) -> bool:
    """Whether Q8_0 holds ``weight [out, in]`` as it is (within float32 rounding): true of a weight
    converted from Q8_0 blocks, as the embedded GGUF's embedding is; false of trained float weights."""
    if weight.shape[-1] % INT4_GROUP:
        return False
    q, d = quantize_q8_0(weight)
    return _holds_exactly(weight, q, d, relative_tolerance)


def _q8_0_values(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The float32 values ``[rows, in]`` of Q8_0 blocks: int8 ``q`` ``[rows, in]`` times ``d`` ``[rows, in / 32]`` per group."""
    return (q.float().view(q.shape[0], -1, INT4_GROUP) * d[..., None]).view(q.shape)


def _holds_exactly(weight: torch.Tensor, q: torch.Tensor, d: torch.Tensor, relative_tolerance: float = 1e-6) -> bool:
    """Whether Q8_0 blocks ``(q, d)`` give ``weight`` back within ``relative_tolerance`` of its largest
    value; 4,096 rows at a time (the output layer's whole error would be a float32 copy of it)."""
    bound = relative_tolerance * weight.abs().max()
    for start in range(0, weight.shape[0], 4096):
        rows = slice(start, start + 4096)
        if bool((_q8_0_values(q[rows], d[rows]) - weight[rows].float()).abs().max() > bound):
            return False
    return True


def _cpu_kernels():
    from . import cpu_kernels

    kernels = cpu_kernels.load(None)
    if kernels is None:
        raise NotImplementedError(
            f"block-quantized kernels unavailable: {cpu_kernels.unavailable_reason() or 'no build'}"
        )
    return kernels


def _int4_from_float(weight: torch.Tensor, bias: torch.Tensor | None) -> Int4Linear:
    layer = Int4Linear.from_float(weight, bias)
    layer.release_debug_copy()
    return layer


_BUILDERS: dict[str, Callable[[torch.Tensor, torch.Tensor | None], WeightLinear]] = {
    "float32": Float32Linear,
    "bfloat16": Bfloat16Linear,
    "int8": Int8Linear,
    "int4": _int4_from_float,
    "q4_1": Q4_1Linear.from_float,
    "q8_0": Q8_0Linear,
}


# --- Plans: which format for how many rows ----------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Formats by row count: ``steps`` is ``((max_rows, format), ...)`` ascending, the last ``max_rows`` ``None`` (no limit).

    ``Plan.single("int8")`` uses one format everywhere.
    """

    steps: tuple[tuple[int | None, str], ...]

    @classmethod
    def single(cls, name: str) -> Plan:
        return cls(((None, name),))

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for _, name in self.steps))

    def format_for(self, rows: int) -> str:
        for max_rows, name in self.steps:
            if max_rows is None or rows <= max_rows:
                return name
        return self.steps[-1][1]

    def describe(self) -> str:
        if len(self.steps) == 1:
            return self.steps[0][1]
        parts, low = [], 1
        for max_rows, name in self.steps:
            parts.append(f"{name} for {low}+ rows" if max_rows is None else f"{name} for {low}-{max_rows} rows")
            low = (max_rows or 0) + 1
        return ", ".join(parts)

    def to_json(self) -> list:
        return [list(step) for step in self.steps]

    @classmethod
    def from_json(cls, data: list) -> Plan:
        return cls(tuple((None if m is None else int(m), str(name)) for m, name in data))


class PlannedLinear(WeightLinear):
    """One weight held in each format of a :class:`Plan`; a call runs the format planned for its row count.

    Rows are the product of ``x``'s leading dimensions (a decode step of ``b`` sequences has ``b``).
    """

    format = "planned"

    def __init__(self, layers: dict[str, WeightLinear], plan: Plan) -> None:
        self.layers, self.plan = layers, plan
        first = next(iter(layers.values()))
        self.out_features, self.in_features = first.out_features, first.in_features
        # Row counts up to the largest bound resolved once, so that a call is a list index.
        bound = max((m for m, _ in plan.steps if m is not None), default=0)
        self._by_rows = [layers[plan.format_for(max(rows, 1))] for rows in range(bound + 1)]
        self._beyond = layers[plan.steps[-1][1]]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._layer_for(x)(x)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return self._layer_for(x).compute(x)

    def add_into(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        self._layer_for(x).add_into(x, residual)

    def rounds_input_to_bfloat16(self, rows: int) -> bool:
        return (self._by_rows[rows] if rows < len(self._by_rows) else self._beyond).rounds_input_to_bfloat16(rows)

    def _layer_for(self, x: torch.Tensor) -> WeightLinear:
        rows = x.numel() // self.in_features
        return self._by_rows[rows] if rows < len(self._by_rows) else self._beyond

    def embedding_rows(self, ids: torch.Tensor) -> torch.Tensor | None:
        """The first of the plan's formats that gives them (see :meth:`WeightLinear.embedding_rows`)."""
        for layer in self.layers.values():
            rows = layer.embedding_rows(ids)
            if rows is not None:
                return rows
        return None

    def step_parts(self, rows: int) -> list[StepPart] | None:
        return (self._by_rows[rows] if rows < len(self._by_rows) else self._beyond).step_parts(rows)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers.values())


def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    plan: Plan | str = "float32",
    *,
    q4_1: Q4_1Blocks | None = None,
) -> WeightLinear:
    """The linear layer ``x [..., in] -> [..., out]`` (in ``x``'s dtype) of ``weight [out, in]`` (float32) in ``plan``'s formats.

    ``plan``: a format name or a :class:`Plan`.  ``q4_1``: the weight's own Q4_1 blocks (same shape);
    given, the int4 format is built from them instead of quantizing ``weight``.  Raises ``ValueError``
    for a format this CPU does not run (:func:`check_format`) or a ``q4_1`` of another shape.
    """
    if isinstance(plan, str):
        plan = Plan.single(plan)
    if q4_1 is not None and q4_1.shape != tuple(weight.shape):
        raise ValueError(f"Q4_1 blocks of shape {q4_1.shape} for a weight of shape {tuple(weight.shape)}")
    layers: dict[str, WeightLinear] = {}
    for name in plan.formats:
        check_format(name)
        if name == "int4" and q4_1 is not None:
            int4 = Int4Linear(q4_1, bias)
            int4.release_debug_copy()
            layers[name] = int4
        elif name == "q4_1" and q4_1 is not None:
            layers[name] = Q4_1Linear(q4_1, bias)
        else:
            layers[name] = _BUILDERS[name](weight, bias)
    if len(layers) == 1:
        return next(iter(layers.values()))
    return PlannedLinear(layers, plan)


@dataclass(frozen=True)
class Choice:
    """The plans for a model: ``layers`` for the decoder layers' projections, ``output`` for the output layer.

    ``source``: ``"autotune"``, ``"cache"`` or ``"requested"``; ``timings``: ms per sweep by format
    and batch, as measured (empty unless autotuned); ``bfloat16_prefill``: whether the ``q4_1``
    layers run long prefill chunks in bfloat16 (:meth:`make_layer`), as the autotune measured.
    """

    layers: Plan
    output: Plan
    source: str
    timings: dict = field(default_factory=dict)
    bfloat16_prefill: bool = False

    def make_layer(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, q4_1: Q4_1Blocks | None = None
    ) -> WeightLinear:
        """A decoder layer's projection in ``layers``' formats (see :func:`make_linear`).

        Where ``bfloat16_prefill`` (the autotune timed it faster here: :func:`_time_bfloat16_prefill`),
        its ``q4_1`` layers run prefill chunks of :data:`BFLOAT16_PREFILL_ROWS` rows or more in
        bfloat16, from a bfloat16 copy of the blocks made for each such call, as a ``bfloat16``
        layer computes but without keeping a second copy of the weights (212 MB for the embedded model).
        """
        layer = make_linear(weight, bias, self.layers, q4_1=q4_1)
        linears = layer.layers.values() if isinstance(layer, PlannedLinear) else [layer]
        blocks = [linear for linear in linears if isinstance(linear, Q4_1Linear)]
        if blocks and self.bfloat16_prefill and bfloat16_prefill_available():
            for linear in blocks:
                linear.bfloat16_rows = BFLOAT16_PREFILL_ROWS
        return layer

    def make_output(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> WeightLinear:
        """The output layer (``[vocab, hidden]``, tied to the embedding) in ``output``'s formats."""
        return make_linear(weight, bias, self.output)

    def describe(self) -> str:
        prefill = f", bfloat16 from {BFLOAT16_PREFILL_ROWS} rows" if self.bfloat16_prefill else ""
        return f"layers: {self.layers.describe()}{prefill}; output layer: {self.output.describe()} ({self.source})"


# From this many rows on (a long prefill chunk, or a decode batch this large), auto's q4_1 layers
# multiply in bfloat16 where the CPU runs it natively (Choice.make_layer), at the price of a prompt's
# log-probabilities depending on its chunks (docs/performance.md#long-prefill-chunks-in-bfloat16).
BFLOAT16_PREFILL_ROWS = 160
# ... but only where it is faster, which varies by CPU: the autotune times both on a prefill chunk of
# this many rows and keeps bfloat16 when it takes under BFLOAT16_PREFILL_GAIN of our time (beyond the noise).
PREFILL_TIMING_ROWS = 256
BFLOAT16_PREFILL_GAIN = 0.9


def bfloat16_prefill_available() -> bool:
    """Whether q4_1 layers (which exist only where our kernels loaded) may run long prefill chunks in
    bfloat16 here: oneDNN's bfloat16 product runs (the ``bfloat16`` format is supported) and our
    kernels have their AVX-512 products."""
    from . import cpu_kernels

    return "bfloat16" in supported_formats() and cpu_kernels.avx512_products()


def output_beside_kernels(choice: Choice) -> Choice:
    """``choice`` with the output layer in ``q8_0`` at the row counts where the layers run ``q4_1``.

    Our AVX2 kernels and oneDNN's AVX-512/AMX code do not mix well within a decode step, and at more
    rows a bfloat16 copy of the output layer bought little for its memory
    (docs/performance.md#the-output-layer-beside-the-q4_1-kernels).  Only for an output layer whose
    ``q8_0`` blocks are exact (the caller's check): the GGUF's own values, so nothing is lost.
    """
    bounds = sorted({rows for rows, _ in (*choice.layers.steps, *choice.output.steps) if rows is not None}) or [1]
    steps: list[tuple[int | None, str]] = []
    for bound in [*bounds, None]:
        rows = bound if bound is not None else bounds[-1] + 1
        beside = choice.layers.format_for(rows) == "q4_1"
        name = "q8_0" if beside else choice.output.format_for(rows)
        if steps and steps[-1][1] == name:
            steps[-1] = (bound, name)
        else:
            steps.append((bound, name))
    return dataclasses.replace(choice, output=Plan(tuple(steps)))


# --- The GGUF's own blocks ---------------------------------------------------------------------------------

_GGUF_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# A Llama decoder layer's projections, under transformers' names (``model.layers.{i}.{name}.weight``).
LAYER_PROJECTIONS = tuple(_GGUF_TO_HF.values())


def gguf_tensor_types(path: Path) -> dict[str, str]:
    """``{GGUF tensor name: ggml type name}`` of a GGUF file (e.g. ``blk.0.attn_q.weight: Q4_1``)."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def _unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    # llama.cpp's converter interleaves each head's rotary halves in q/k rows
    # (convert_hf_to_gguf's LlamaModel.permute); transformers undoes it when reading a GGUF.  The same
    # row order, as an index: applying the inverse reshape/transpose to 0..rows-1.
    index = torch.arange(rows)
    return index.reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


def read_q4_1_blocks(path: Path, num_heads: int, num_kv_heads: int) -> dict[str, Q4_1Blocks]:
    """The Q4_1 tensors of a Llama GGUF, under transformers' parameter names, rows in transformers' order.

    Keys like ``model.layers.0.self_attn.q_proj.weight``.  ``num_heads``/``num_kv_heads`` undo the
    converter's q/k row interleaving.  Tensors of other types (the embedding, norms) are left out.
    Source: ggml's ``block_q4_1`` (``ggml-common.h``): per 32 weights, ``d`` and ``m`` as float16,
    then 16 bytes whose low nibbles are weights 0..15 and high nibbles 16..31.
    """
    from gguf import GGMLQuantizationType, GGUFReader

    blocks: dict[str, Q4_1Blocks] = {}
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type != GGMLQuantizationType.Q4_1 or not tensor.name.startswith("blk."):
            continue
        _, layer, kind, _ = tensor.name.split(".")
        raw = np.asarray(tensor.data, dtype=np.uint8)
        rows = raw.shape[0]
        raw = raw.reshape(rows, -1, 20)
        d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0])
        m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0])
        packed = torch.from_numpy(raw[..., 4:].copy())
        q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).reshape(rows, -1)
        item = Q4_1Blocks(q.contiguous(), d.contiguous(), m.contiguous())
        if kind in ("attn_q", "attn_k"):
            item = item.rows(_unpermute_rows(rows, num_heads if kind == "attn_q" else num_kv_heads))
        blocks[f"model.layers.{layer}.{_GGUF_TO_HF[kind]}.weight"] = item
    return blocks


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    # Q4_1's own byte order (weights i and i + 16 of a group share a byte): half the bytes on disk.
    groups = q.reshape(q.shape[0], -1, 2, INT4_GROUP // 2)
    return (groups[:, :, 0] | (groups[:, :, 1] << 4)).reshape(q.shape[0], -1)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    groups = packed.reshape(packed.shape[0], -1, INT4_GROUP // 2)
    return torch.cat([groups & 0x0F, groups >> 4], dim=-1).reshape(packed.shape[0], -1).contiguous()


def load_q4_1_blocks(path: Path, num_heads: int, num_kv_heads: int, cache_dir: Path) -> dict[str, Q4_1Blocks]:
    """:func:`read_q4_1_blocks`, kept under ``cache_dir`` as safetensors after the first call.

    GGUFReader parses the whole file's metadata (the tokenizer's 49152 strings and merges) in Python;
    the cached blocks load far faster (docs/performance.md#the-autotunes-noise-and-the-ggufs-blocks).
    The file name
    carries a digest of the GGUF's contents and the head counts, so a new file reads anew and the
    same file elsewhere (a new virtual environment) does not.
    """
    from safetensors.torch import load_file, save_file

    from .digests import file_digest

    digest = hashlib.sha256(f"{file_digest(Path(path))}:{num_heads}:{num_kv_heads}".encode())
    target = Path(cache_dir) / f"{Path(path).stem}-q4_1-{digest.hexdigest()[:12]}.safetensors"
    try:
        tensors = load_file(target)
        names = {key.rsplit(".", 1)[0] for key in tensors}
        return {
            name: Q4_1Blocks(_unpack_nibbles(tensors[f"{name}.q"]), tensors[f"{name}.d"], tensors[f"{name}.m"])
            for name in names
        }
    except (OSError, KeyError, ValueError, RuntimeError):
        pass
    blocks = read_q4_1_blocks(path, num_heads, num_kv_heads)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        save_file(
            {
                f"{name}.{part}": tensor.contiguous()
                for name, b in blocks.items()
                for part, tensor in (("q", _pack_nibbles(b.q)), ("d", b.d), ("m", b.m))
            },
            str(partial),
        )
        partial.replace(target)
    except OSError as error:
        logger.warning("Could not cache the Q4_1 blocks in %s: %s", target, error)
    return blocks


# --- The autotune -------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's name for it elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def autotune_key(
    layer_shapes: Sequence[tuple[int, int]],
    layers: int,
    output_shape: tuple[int, int],
    batch_sizes: Sequence[int],
    act_dtype: torch.dtype,
    memory_budget: int,
    formats: Sequence[str],
) -> dict:
    """What a cached choice is valid for: the CPU, torch's dispatch, the thread count and the shapes timed."""
    return {
        "version": AUTOTUNE_VERSION,
        "cpu": cpu_model(),
        "capability": cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "layer_shapes": [list(s) for s in layer_shapes],
        "layers": layers,
        "output_shape": list(output_shape),
        "batch_sizes": list(batch_sizes),
        "act_dtype": str(act_dtype),
        "memory_budget": memory_budget,
        "formats": list(formats),
    }


def _build_random(name: str, shape: tuple[int, int], generator: torch.Generator) -> WeightLinear:
    # Speed does not depend on the values, only on the bytes read: a random tile of 64 rows repeated
    # fills the memory at the cost of a copy (randn and quantizing 100 M weights would take seconds).
    out, inp = shape
    repeats = -(-out // 64)

    def tiled(tile: torch.Tensor) -> torch.Tensor:
        return tile.repeat(repeats, 1)[:out].contiguous()

    if name == "int4":
        q = tiled(torch.randint(0, 16, (64, inp), dtype=torch.uint8, generator=generator))
        d = torch.full((out, inp // INT4_GROUP), 0.01, dtype=torch.float16)
        layer = Int4Linear(Q4_1Blocks(q, d, -8 * d))
        layer.release_debug_copy()
        return layer
    if name == "q4_1":
        q = tiled(torch.randint(0, 16, (64, inp), dtype=torch.uint8, generator=generator))
        d = torch.full((out, inp // INT4_GROUP), 0.01, dtype=torch.float16)
        return Q4_1Linear(Q4_1Blocks(q, d, -8 * d))
    if name == "int8":
        q = tiled(torch.randint(-127, 128, (64, inp), dtype=torch.int8, generator=generator))
        return Int8Linear.from_quantized(q, torch.full((out,), 0.001))
    return _BUILDERS[name](tiled(torch.randn(64, inp, generator=generator) * 0.02), None)


def _time_sweeps(
    formats: Sequence[str],
    layer_shapes: Sequence[tuple[int, int]],
    layers: int,
    output_shape: tuple[int, int],
    batch_sizes: Sequence[int],
    act_dtype: torch.dtype,
    repeats: int,
    time_limit: float,
) -> dict[str, dict[str, dict[int, float]]]:
    """``{"layers"|"output": {format: {batch: ms}}}``: the fastest of ``repeats`` sweeps (one format at a time in memory)."""
    generator = torch.Generator().manual_seed(0)
    timings: dict[str, dict[str, dict[int, float]]] = {"layers": {}, "output": {}}
    started = time.perf_counter()
    inputs = {
        (b, k): torch.randn(b, k, dtype=act_dtype)
        for b in batch_sizes
        for k in {s[1] for s in layer_shapes} | {output_shape[1]}
    }
    for name in formats:
        if timings["layers"] and time.perf_counter() - started > time_limit:
            # A start must not wait on a busy machine: the formats timed so far decide.
            logger.warning("Weight format autotune past %.0f s; %s not timed", time_limit, name)
            continue
        stack = [[_build_random(name, shape, generator) for shape in layer_shapes] for _ in range(layers)]
        output = _build_random(name, output_shape, generator)
        layer_ms: dict[int, float] = {}
        output_ms: dict[int, float] = {}
        for batch in batch_sizes:
            if layer_ms and time.perf_counter() - started > time_limit:
                break
            best_layers = min((t[batch] for t in timings["layers"].values() if batch in t), default=math.inf)
            for rep in range(repeats + 1):  # the first run warms the kernels and is not counted
                t0 = time.perf_counter()
                for block in stack:
                    for linear in block:
                        linear(inputs[(batch, linear.in_features)])
                t1 = time.perf_counter()
                output(inputs[(batch, output_shape[1])])
                t2 = time.perf_counter()
                if rep:
                    layer_ms[batch] = min(layer_ms.get(batch, math.inf), (t1 - t0) * 1000)
                    output_ms[batch] = min(output_ms.get(batch, math.inf), (t2 - t1) * 1000)
                # A format far behind the best so far, or a spent time budget, is not worth more runs.
                if rep and ((t1 - t0) * 1000 > 3 * best_layers or time.perf_counter() - started > time_limit):
                    break
                if not rep and (t1 - t0) * 1000 > 3 * best_layers:
                    layer_ms[batch], output_ms[batch] = (t1 - t0) * 1000, (t2 - t1) * 1000
                    break
        timings["layers"][name], timings["output"][name] = layer_ms, output_ms
        del stack, output
    return timings


def _time_bfloat16_prefill(
    layer_shapes: Sequence[tuple[int, int]], act_dtype: torch.dtype, repeats: int
) -> dict[str, float]:
    """ms for one layer of each of ``layer_shapes`` in ``q4_1`` at :data:`PREFILL_TIMING_ROWS` rows
    (a long prefill chunk), by our kernel (``"q4_1"``) and in bfloat16 from a copy made per call
    (``"bfloat16"``, as :meth:`Choice.make_layer` would run them): the best of ``repeats``, the two
    taking turns, after a warm-up of each."""
    generator = torch.Generator().manual_seed(0)
    stack = [_build_random("q4_1", shape, generator) for shape in layer_shapes]
    inputs = {k: torch.randn(PREFILL_TIMING_ROWS, k, dtype=act_dtype) for k in {s[1] for s in layer_shapes}}
    best = {"q4_1": math.inf, "bfloat16": math.inf}
    for rep in range(repeats + 1):
        for name in ("q4_1", "bfloat16") if rep % 2 else ("bfloat16", "q4_1"):
            for linear in stack:
                linear.bfloat16_rows = 1 if name == "bfloat16" else None  # type: ignore[attr-defined]  # _build_random("q4_1") builds Q4_1Linear
            started = time.perf_counter()
            for linear in stack:
                linear(inputs[linear.in_features])
            if rep:
                best[name] = min(best[name], (time.perf_counter() - started) * 1000)
    return best


def _weight_bytes(name: str, shapes: Sequence[tuple[int, int]], count: int) -> int:
    per_value = {
        "float32": 4.0,
        "bfloat16": 2.0,
        "int8": 1.0,
        "int4": 0.5 + 4 / INT4_GROUP,
        "q4_1": 0.5 + 8 / INT4_GROUP,
        "q8_0": 1.0 + 4 / INT4_GROUP,
    }[name]
    return int(count * sum(out * inp * per_value for out, inp in shapes))


# How far behind the fastest format a format may time at a batch size and still count as fast there
# (plan_from_timings): the timings' own noise between starts of a server
# (docs/performance.md#the-autotunes-noise-and-the-ggufs-blocks).
NEAR_FASTEST = 0.25


def plan_from_timings(
    timings: dict[str, dict[int, float]], batch_sizes: Sequence[int], sizes: dict[str, int], memory_budget: int
) -> Plan:
    """The plan of the fastest format at each timed batch size, if its formats' memory fits ``memory_budget``.

    Each timed batch size covers rows up to the geometric middle between it and the next (1 and 8:
    up to 2 rows; 8 and 32: up to 16).  A format within :data:`NEAR_FASTEST` of the fastest at a
    batch size counts as fast there; each batch size takes the fast format that is fast at the most
    batch sizes, then the smallest: each more format in a plan is one more copy of the weights in
    memory, kept only for a gain larger than the autotune's own noise.  When those formats together
    do not fit ``memory_budget``, the fastest format at each batch size, if they fit; else one
    format: the one fitting the budget with the least total slowdown against the best at each batch
    size (or the smallest, if none fits).  ``sizes``: bytes each format needs; a missing or NaN
    timing counts as infinitely slow.
    """
    batch_sizes = sorted(batch_sizes)
    # A missing or NaN timing counts as never fast.
    timings = {name: {b: ms for b, ms in by_batch.items() if not math.isnan(ms)} for name, by_batch in timings.items()}
    fastest = {b: min(t.get(b, math.inf) for t in timings.values()) for b in batch_sizes}
    fast_at = {
        name: {b for b in batch_sizes if by_batch.get(b, math.inf) <= fastest[b] * (1 + NEAR_FASTEST)}
        for name, by_batch in timings.items()
    }
    ranked = sorted(timings, key=lambda name: (-len(fast_at[name]), sizes[name], name))
    near = [next(name for name in ranked if b in fast_at[name]) for b in batch_sizes]
    strict = [min(timings, key=lambda name: timings[name].get(b, math.inf)) for b in batch_sizes]
    # The plan of fast formats; if it does not fit, the fastest format at each batch size, if that does.
    for best in (near, strict):
        if sum(sizes[name] for name in set(best)) <= memory_budget:
            steps: list[tuple[int | None, str]] = []
            for i, (batch, name) in enumerate(zip(batch_sizes, best)):
                bound = None if i == len(batch_sizes) - 1 else int(math.sqrt(batch * batch_sizes[i + 1]))
                if steps and steps[-1][1] == name:
                    steps[-1] = (bound, name)
                else:
                    steps.append((bound, name))
            return Plan(tuple(steps))
    fitting = [name for name in timings if sizes[name] <= memory_budget] or [min(timings, key=sizes.__getitem__)]

    def slowdown(name: str) -> float:
        return sum(
            timings[name].get(b, math.inf) / min(t.get(b, math.inf) for t in timings.values()) for b in batch_sizes
        )

    return Plan.single(min(fitting, key=slowdown))


# The share of the machine's CPU time that other programs may take while the autotune times formats
# for its choice to be cached: a choice timed beside a build or a test run is not one to keep.
BUSY_SHARE = 0.2


def _cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds every CPU spent busy, CPU seconds of this process) since boot; None where
    /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK"), time.process_time()


def _others_share(before: tuple[float, float] | None, after: tuple[float, float] | None, seconds: float) -> float:
    """The share of all CPUs' time over ``seconds`` that went to other processes (0 where unknown)."""
    if before is None or after is None or seconds <= 0:
        return 0.0
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(others, 0.0) / (seconds * (os.cpu_count() or 1))


def choose_formats(
    requested: str = "auto",
    *,
    cache_dir: Path = Path(".cache/models/weight_formats"),
    layer_shapes: Sequence[tuple[int, int]] = EMBEDDED_LAYER_SHAPES,
    layers: int = EMBEDDED_LAYERS,
    output_shape: tuple[int, int] = EMBEDDED_OUTPUT_SHAPE,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    act_dtype: torch.dtype = torch.float32,
    candidates: Sequence[str] = AUTO_FORMATS,
    output_candidates: Sequence[str] | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    repeats: int = 3,
    time_limit: float = 6.0,
) -> Choice:
    """The weight formats to build the model's linears in (``MODEL_WEIGHTS``): a :class:`Choice`.

    ``requested``: ``auto`` or a format of :data:`FORMATS` (used for every layer and batch; raises
    ``ValueError`` when unknown or not supported here).  ``auto``: the cached choice for this CPU,
    capability, torch, thread count and shapes (:func:`autotune_key`) if there is one, else an
    autotune: each supported format in ``candidates`` built for ``layers`` distinct layers of
    ``layer_shapes`` (so that weights stream from memory as they do in the model) plus the output
    layer, timed at each of ``batch_sizes`` rows with ``act_dtype`` activations (best of ``repeats``
    after a warm-up; past ``time_limit`` seconds no more repeats, batch sizes or formats are timed,
    the formats timed so far deciding), then :func:`plan_from_timings` per role; the output layer
    chooses among ``output_candidates`` (default: ``candidates``).
    The choice is logged and written to ``cache_dir`` as JSON (a failed write is logged, not raised),
    unless the timing was cut short or other programs took more than :data:`BUSY_SHARE` of the CPUs
    meanwhile (the next start times again).
    """
    if requested != "auto":
        check_format(requested)
        choice = Choice(Plan.single(requested), Plan.single(requested), "requested")
        logger.info("Weight formats: %s", choice.describe())
        return choice
    # Timed in the order of TIMING_ORDER: if a busy machine cuts the autotune short, the formats
    # timed first (the ones that usually win) are those it chooses among.
    supported = supported_formats()
    layer_formats = [name for name in candidates if name in supported]
    output_formats = [name for name in (output_candidates or candidates) if name in supported] or layer_formats
    formats = sorted(set(layer_formats) | set(output_formats), key=TIMING_ORDER.index)
    key = autotune_key(layer_shapes, layers, output_shape, batch_sizes, act_dtype, memory_budget, formats)
    key["layer_formats"], key["output_formats"] = sorted(layer_formats), sorted(output_formats)
    if {"q4_1", "q8_0"} & set(formats):
        key["kernels"] = _cpu_kernels().path.name  # a new build of our kernels times again
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"{digest}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            choice = Choice(
                Plan.from_json(cached["layers"]),
                Plan.from_json(cached["output"]),
                "cache",
                cached.get("timings", {}),
                bool(cached.get("bfloat16_prefill", False)),
            )
            if set(choice.layers.formats + choice.output.formats) <= set(formats):
                logger.info("Weight formats: %s, from %s", choice.describe(), path)
                return choice
    except (OSError, ValueError, KeyError, TypeError):
        pass
    started, machine_before = time.perf_counter(), _cpu_seconds()
    with torch.inference_mode():
        timings = _time_sweeps(formats, layer_shapes, layers, output_shape, batch_sizes, act_dtype, repeats, time_limit)
    others = _others_share(machine_before, _cpu_seconds(), time.perf_counter() - started)
    layer_sizes = {name: _weight_bytes(name, layer_shapes, layers) for name in formats}
    output_sizes = {name: _weight_bytes(name, [output_shape], 1) for name in formats}
    # The two roles share the budget: the output layer gets what the layers' plan leaves.
    layer_timings = {name: by_batch for name, by_batch in timings["layers"].items() if name in layer_formats}
    layers_plan = plan_from_timings(layer_timings or timings["layers"], batch_sizes, layer_sizes, memory_budget)
    left = memory_budget - sum(layer_sizes[name] for name in layers_plan.formats)
    output_timings = {name: by_batch for name, by_batch in timings["output"].items() if name in output_formats}
    output_plan = plan_from_timings(output_timings or timings["output"], batch_sizes, output_sizes, max(left, 0))
    readable = {
        role: {name: {str(b): round(ms, 2) for b, ms in by_batch.items()} for name, by_batch in table.items()}
        for role, table in timings.items()
    }
    bfloat16_prefill = False
    if "q4_1" in layers_plan.formats and bfloat16_prefill_available():
        with torch.inference_mode():
            prefill = _time_bfloat16_prefill(layer_shapes, act_dtype, repeats)
        readable["prefill"] = {name: {str(PREFILL_TIMING_ROWS): round(ms, 2)} for name, ms in prefill.items()}
        bfloat16_prefill = prefill["bfloat16"] < BFLOAT16_PREFILL_GAIN * prefill["q4_1"]
    choice = Choice(layers_plan, output_plan, "autotune", readable, bfloat16_prefill)
    logger.info(
        "Weight formats: %s; autotuned in %.1f s on %s (%s, %d threads); ms per sweep: %s",
        choice.describe(),
        time.perf_counter() - started,
        key["cpu"],
        key["capability"],
        key["threads"],
        readable,
    )
    complete = len(timings["layers"]) == len(formats) and all(
        len(t) == len(batch_sizes) for t in timings["layers"].values()
    )
    if not complete:
        logger.warning(
            "Weight formats not cached: the autotune ran out of time (a busy machine?); the next start times again"
        )
        return choice
    if others > BUSY_SHARE:
        logger.warning(
            "Weight formats not cached: other programs used %.0f%% of the CPUs while they were timed; "
            "the next start times again",
            100 * others,
        )
        return choice
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(
            json.dumps(
                {
                    "key": key,
                    "layers": layers_plan.to_json(),
                    "output": output_plan.to_json(),
                    "bfloat16_prefill": bfloat16_prefill,
                    "timings": readable,
                },
                indent=1,
            )
        )
        partial.replace(path)
    except OSError as error:
        logger.warning("Could not cache the weight formats in %s: %s", path, error)
    return choice


def llama_linear_factory(choice: Choice, q4_1: dict[str, Q4_1Blocks] | None = None):
    """The ``linear_factory`` of :class:`inference.llama.LlamaModelRunner` building ``choice``'s formats.

    The runner calls it with ``(weight [out, in], activation dtype, names)``, ``names`` the model's
    parameters stacked into ``weight`` (``("lm_head.weight",)`` for the output layer).  Decoder
    projections follow ``choice.layers``, built from their own Q4_1 blocks (``q4_1``, by name, as
    :func:`load_q4_1_blocks` returns them; stacked with :meth:`Q4_1Blocks.cat`) when the plan has
    int4 and every stacked name has blocks; the output layer follows ``choice.output``.  Each
    returned linear keeps the activation's dtype.
    """

    def factory(weight: torch.Tensor, dtype: torch.dtype, names: tuple[str, ...] = ()) -> WeightLinear:
        if names == ("lm_head.weight",):
            return choice.make_output(weight)
        blocks = None
        wants_blocks = {"int4", "q4_1"} & set(choice.layers.formats)
        if q4_1 is not None and wants_blocks and names and all(name in q4_1 for name in names):
            blocks = Q4_1Blocks.cat([q4_1[name] for name in names])
        return choice.make_layer(weight, q4_1=blocks)

    factory.description = choice.describe()  # type: ignore[attr-defined]  # the runner reads it if present
    return factory
