"""ggml's tensor types: their block layouts, a reference dequantizer, and the linear layers that
multiply a GGUF's blocks on our kernels.

Layouts are ggml's (``ggml-common.h``): a row of ``K`` weights is ``K / block_size`` blocks of
``type_size`` bytes.  The types served, as the Q4_K_M, Q5_K_M, Q6_K and Q8_0 files people download
contain them: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.

:func:`linear` builds a layer from a tensor's raw bytes (``uint8 [rows, row_bytes]``):

- Q4_0 and Q4_1 become :class:`inference.weights.Q4_1Linear` (4-bit values with a float32 scale
  and minimum per group of 32): the same weights exactly, on our tuned Q4_1 products (and the
  Llama runner's whole-step decode call).
- Q8_0 becomes :class:`inference.weights.Q8_0Linear` (int8 values, float32 scales): exact.
- Q4_K, where the K-quants' x is rounded to 8 bits (the default) on AVX-512 VNNI, runs on a copy
  of its blocks interleaved by 8 rows (:func:`interleaves`), as llama.cpp's CPU backend repacks it at load: the
  same bytes, a weight row in each lane of the integer products; the file's pages are released.
- The other types run on :class:`GGMLLinear`, our kernels' products of the blocks as stored
  (:meth:`inference.cpu_kernels.CPUKernels.ggml_gemm`): the K-quants with x rounded to 8 bits
  and integer products (``ENGINE_K_QUANT_Q8_ACTIVATIONS``, the default), the other types up to 4
  rows (a decode step of few streams, bound by reading the weights) x rounded to 16 bits, else
  float32.  Where the K-quants' x is not rounded to 8 bits (``ENGINE_K_QUANT_Q8_ACTIVATIONS=false``),
  Q4_K builds a Q4_1Linear copy (exact: its ``d * sc`` and ``dmin * m`` are float32 values) at its
  first product of more than 4 rows (a prefill chunk), whose tiled 16-bit integer products are about
  twice as fast as the float32 block loop there; the 8-bit products are faster than both.

No Django, no transformers here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..cpu_kernels import Q4_K_X8
from ..weights import (
    BFLOAT16_PREFILL_GAIN,
    BFLOAT16_PREFILL_ROWS,
    PREFILL_TIMING_ROWS,
    STEP_GGML,
    Float32Linear,
    Q4_1Linear,
    Q8_0Linear,
    StepPart,
    WeightLinear,
    _BlockLinear,
    _cpu_kernels,
    bfloat16_prefill_available,
)

logger = logging.getLogger(__name__)
# The bfloat16 copy of a layer a long prefill chunk multiplies (GGMLLinear._bfloat16_weight): one a
# thread, as large as the largest layer, for as long as the thread lives.
_scratch = threading.local()

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30

# type id -> (name, weights per block, bytes per block)
TYPES: dict[int, tuple[str, int, int]] = {
    F32: ("F32", 1, 4),
    F16: ("F16", 1, 2),
    BF16: ("BF16", 1, 2),
    Q4_0: ("Q4_0", 32, 18),
    Q4_1: ("Q4_1", 32, 20),
    Q5_0: ("Q5_0", 32, 22),
    Q5_1: ("Q5_1", 32, 24),
    Q8_0: ("Q8_0", 32, 34),
    Q4_K: ("Q4_K", 256, 144),
    Q5_K: ("Q5_K", 256, 176),
    Q6_K: ("Q6_K", 256, 210),
}
GROUP = 32


def is_known(kind: int) -> bool:
    return kind in TYPES


def type_name(kind: int) -> str:
    """The type's ggml name (``Q4_K``); for a type not served here, gguf-py's name or its number."""
    if kind == Q4_K_X8:
        return "Q4_K_X8"
    if kind in TYPES:
        return TYPES[kind][0]
    try:
        from gguf import GGMLQuantizationType

        return f"{GGMLQuantizationType(kind).name} ({kind})"
    except (ImportError, ValueError):
        return str(kind)


def supported_names() -> list[str]:
    return [name for name, _, _ in TYPES.values()]


def block_size(kind: int) -> int:
    return TYPES[kind][1]


def type_size(kind: int) -> int:
    return TYPES[kind][2]


def bits_per_weight(kind: int) -> float:
    return 8 * type_size(kind) / block_size(kind)


def dequantize(raw: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """Float32 values ``[rows, width]`` of ``raw`` (``uint8 [rows, row_bytes]``): gguf-py's reference
    dequantizers (``gguf.quants``), or a view's conversion for the float types."""
    rows = raw.shape[0]
    if kind == F32:
        return raw.contiguous().view(torch.float32).reshape(rows, width).clone()
    if kind == F16:
        return raw.contiguous().view(torch.float16).reshape(rows, width).float()
    if kind == BF16:
        return raw.contiguous().view(torch.bfloat16).reshape(rows, width).float()
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as reference

    values = reference(raw.numpy(), GGMLQuantizationType(kind))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(rows, width)


# --- Exact conversions to our Q4_1 and Q8_0 layouts ---------------------------------------------------


def _halves(raw: np.ndarray, start: int) -> np.ndarray:
    return raw[..., start : start + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def q4_1_parts(raw: torch.Tensor, kind: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(qs, d, m)`` of a Q4_0, Q4_1 or Q4_K tensor in :class:`inference.weights.Q4_1Linear`'s
    layout: ``qs`` uint8 ``[rows, K / 2]`` (per group of 32, byte ``i`` holds weights ``i`` (low
    nibble) and ``i + 16``), ``d``/``m`` float32 ``[rows, K / 32]``; weight ``= d q + m`` exactly as
    ggml's ``dequantize_row_*`` computes it.  Raises ``ValueError`` for another type."""
    data = raw.numpy()
    rows = data.shape[0]
    if kind in (Q4_0, Q4_1):
        blocks = data.reshape(rows, -1, type_size(kind))
        d = _halves(blocks, 0)
        m = -8 * d if kind == Q4_0 else _halves(blocks, 2)
        qs = blocks[..., type_size(kind) - 16 :].reshape(rows, -1)
        return torch.from_numpy(np.ascontiguousarray(qs)), torch.from_numpy(d), torch.from_numpy(m)
    if kind != Q4_K:
        raise ValueError(f"{type_name(kind)} has no Q4_1 form")
    blocks = data.reshape(rows, -1, 144)
    d, dmin = _halves(blocks, 0), _halves(blocks, 2)
    scales, mins = _k_scales(blocks[..., 4:16])  # [rows, blocks, 8] each
    chunks = blocks[..., 16:].reshape(rows, -1, 4, 32)  # four 64-weight chunks of 32 bytes
    # Chunk c's low nibbles are group 2c, its high nibbles group 2c + 1.
    values = np.stack([chunks & 0x0F, chunks >> 4], axis=3).reshape(rows, -1, 32)  # [rows, groups, 32]
    packed = values[..., :16] | (values[..., 16:] << 4)
    d_groups = (d[..., None] * scales).reshape(rows, -1)
    m_groups = -(dmin[..., None] * mins).reshape(rows, -1)
    return (
        torch.from_numpy(np.ascontiguousarray(packed.reshape(rows, -1))),
        torch.from_numpy(np.ascontiguousarray(d_groups, dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(m_groups, dtype=np.float32)),
    )


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and minimums of Q4_K/Q5_K blocks from their 12 bytes (ggml's
    ``get_scale_min_k4``), as float32 ``[..., 8]`` each."""
    q = packed.astype(np.uint8)
    low_scales, low_mins = q[..., 0:4] & 63, q[..., 4:8] & 63
    high_scales = (q[..., 8:12] & 0x0F) | ((q[..., 0:4] >> 6) << 4)
    high_mins = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    scales = np.concatenate([low_scales, high_scales], axis=-1).astype(np.float32)
    mins = np.concatenate([low_mins, high_mins], axis=-1).astype(np.float32)
    return scales, mins


def q8_0_parts(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, d)`` of a Q8_0 tensor in :class:`inference.weights.Q8_0Linear`'s layout: int8 ``[rows, K]``
    and float32 ``[rows, K / 32]`` (ggml's float16 scales, exact)."""
    data = raw.numpy()
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, 34)
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, -1)
    return torch.from_numpy(q), torch.from_numpy(_halves(blocks, 0))


# --- Layers -------------------------------------------------------------------------------------------


def linear(raw: torch.Tensor, kind: int, width: int) -> WeightLinear:
    """The layer ``x [rows, width] -> [rows, out]`` of a tensor's bytes ``raw`` (``uint8 [out, row_bytes]``),
    in the form the module docstring gives for its type.  Float types are exact float32 products.
    Raises ``NotImplementedError`` where our kernels cannot run here (the block types need them)."""
    if kind in (Q4_0, Q4_1):  # Q4_1Linear holds these blocks' own bytes
        return Q4_1Linear.from_parts(*q4_1_parts(raw, kind))
    if interleaves(kind, raw.shape[0]):
        return GGMLLinear(_cpu_kernels().interleave_q4_k(raw.contiguous()), Q4_K_X8, width)
    if kind == Q4_K:
        try:
            return GGMLLinear(raw, kind, width, many=lambda: Q4_1Linear.from_parts(*q4_1_parts(raw, kind)))
        except NotImplementedError:
            return Q4_1Linear.from_parts(*q4_1_parts(raw, kind))
    if kind == Q8_0:
        return Q8_0Linear.from_parts(*q8_0_parts(raw))
    if kind == F32:
        return Float32Linear(raw.view(torch.float32).reshape(raw.shape[0], width))
    return GGMLLinear(raw, kind, width)


def interleaves(kind: int, rows: int) -> bool:
    """Whether :func:`linear` makes a tensor of ``kind`` and ``rows`` rows a copy interleaved by 8 rows
    (:meth:`inference.cpu_kernels.CPUKernels.interleave_q4_k`): Q4_K, where the K-quants' x is rounded
    to 8 bits (``ENGINE_K_QUANT_Q8_ACTIVATIONS``, the default) and the products run AVX-512 VNNI's
    code.  The same bytes, rearranged as llama.cpp's CPU backend rearranges them at load: a weight
    row in each lane of the integer products, about a third of the instructions of the products of
    the rows as stored (docs/performance.md#q4_k-interleaved-by-8-rows).  On the AVX2 code the
    stored blocks' panels multiply a prefill chunk faster, and one row on every core reads as fast.
    The file's pages can be released after the copy."""
    if kind != Q4_K or rows % 8:
        return False
    try:
        kernels = _cpu_kernels()
    except NotImplementedError:
        return False
    return hasattr(kernels, "interleave_q4_k") and kernels.avx512 and kernels.vnni and kernels.k_quants_in_int8


def rows_reader(raw: torch.Tensor, kind: int, width: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``read(ids)``: float32 rows ``[n, width]`` of ``raw``'s blocks (an embedding lookup from the
    file's own bytes, :meth:`inference.cpu_kernels.CPUKernels.ggml_dequantize_rows`); None where
    our kernels cannot run here."""
    try:
        kernels = _cpu_kernels()
    except NotImplementedError:
        return None

    def read(ids: torch.Tensor) -> torch.Tensor:
        return kernels.ggml_dequantize_rows(raw, kind, width, ids)

    return read


class GGMLLinear(_BlockLinear):
    """A ggml tensor's blocks as stored (``raw`` ``uint8 [out, row_bytes]``, often a view of the
    memory-mapped file), multiplied by our kernels (:meth:`inference.cpu_kernels.CPUKernels.ggml_gemm`):
    ``x`` times the dequantized weight, up to float32 summation order and x's rounding (to 16 bits up
    to 4 rows, ``set_activation_bits``; the K-quants' to 8 bits at any rows, ``set_k_quant_int8``).
    ``many``: builds the same weight in another of our formats, which takes the products of more than
    :data:`FEW_ROWS` rows where x is not rounded to 8 bits (built at the first such product).  Raises
    ``NotImplementedError`` where the kernels cannot run here."""

    FEW_ROWS = 4  # csrc/ggml_blocks.h's INTEGER_ROWS

    def __init__(
        self,
        raw: torch.Tensor,
        kind: int,
        width: int,
        bias: torch.Tensor | None = None,
        many: Callable[[], _BlockLinear] | None = None,
    ) -> None:
        self.kernels = _cpu_kernels()
        if not hasattr(self.kernels, "ggml_gemm"):
            raise NotImplementedError("this build of our kernels has no ggml block products")
        self.raw, self.kind = raw, kind
        self._make_many = many
        self._many: _BlockLinear | None = None
        self.format = type_name(kind).lower()
        self.out_features, self.in_features = raw.shape[0], width
        self.bias = None if bias is None else bias.detach().float()

    @property
    def many(self) -> _BlockLinear | None:
        if self._many is None and self._make_many is not None:
            self._many = self._make_many()
        return self._many

    def _uses_many(self, rows: int) -> bool:
        if self._make_many is None or rows <= self.FEW_ROWS:
            return False
        return not self.kernels.k_quants_in_int8

    def _product(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self._uses_many(x.shape[0]) and (many := self.many) is not None:
            return many._product(x, out=out)
        return self.kernels.ggml_gemm(x, self.raw, self.kind, out=out)

    def _bfloat16_weight(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight as bfloat16 ``[out_features, in_features]``, into ``out`` where given, else
        into the thread's scratch buffer."""
        if out is None:
            out = _scratch_weight(self.out_features, self.in_features)
        return self.kernels.ggml_to_bfloat16(self.raw, self.kind, self.in_features, out=out)

    def step_parts(self, rows: int) -> list[StepPart] | None:
        if self._in_bfloat16(rows):
            return None
        if self._uses_many(rows):
            many = self.many
            return None if many is None or self.bias is not None else many.step_parts(rows)
        if self.bias is not None or (self.kind in (F32, F16, BF16) and self.in_features % GROUP):
            return None  # a bias, or torch's product (CPUKernels.ggml_gemm)
        return [(STEP_GGML, self.raw.data_ptr(), self.kind, 0, self.out_features)]

    def dequantized(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` (gguf-py's reference dequantizer; our kernels' for the
        interleaved Q4_K, whose values are the same)."""
        if self.kind == Q4_K_X8:
            return self.kernels.ggml_dequantize_rows(
                self.raw, self.kind, self.in_features, torch.arange(self.out_features)
            )
        return dequantize(self.raw, self.kind, self.in_features)

    def _tensors(self):
        return (self.raw, self.bias) + (() if self._many is None else tuple(self._many._tensors()))


class StackedLinear(WeightLinear):
    """Several layers over one input, their outputs side by side: ``[rows, sum of out_features]``
    (q/k/v or gate/up whose tensors have different types, as a Q4_K_M file's do)."""

    format = "stacked"

    def __init__(self, parts: list[WeightLinear]) -> None:
        self.parts = parts
        self.in_features = parts[0].in_features
        self.out_features = sum(part.out_features for part in parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.compute(x)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        if (together := self._in_one_call(x)) is not None:
            return together
        if self._parts_in_bfloat16(x):
            # The parts' copies side by side: one product, no concatenation of their outputs.
            weight = _scratch_weight(self.out_features, self.in_features)
            row = 0
            for part in self.parts:
                assert isinstance(part, GGMLLinear), "_parts_in_bfloat16 admits block layers only"
                part._bfloat16_weight(out=weight[row : row + part.out_features])
                row += part.out_features
            flat = x.reshape(-1, self.in_features)
            return F.linear(flat.to(torch.bfloat16), weight).reshape(*x.shape[:-1], self.out_features)
        return torch.cat([part.compute(x).float() for part in self.parts], dim=-1)

    def _in_one_call(self, x: torch.Tensor) -> torch.Tensor | None:
        """The parts' float32 products side by side from one call of our kernels, where every part is
        stored blocks that take it at these rows (CPUKernels.ggml_gemm_parts); else None."""
        rows = x.numel() // self.in_features
        blocks = [
            part
            for part in self.parts
            if isinstance(part, GGMLLinear)
            and part.bias is None
            and not part._uses_many(rows)
            and not part._in_bfloat16(rows)
        ]
        if len(blocks) != len(self.parts):
            return None
        flat = x.reshape(-1, self.in_features)
        out = blocks[0].kernels.ggml_gemm_parts(flat, [(part.raw, part.kind) for part in blocks])
        return None if out is None else out.reshape(*x.shape[:-1], self.out_features)

    def _parts_in_bfloat16(self, x: torch.Tensor) -> bool:
        rows = x.numel() // self.in_features
        return all(
            isinstance(part, GGMLLinear) and part.bias is None and part._in_bfloat16(rows) for part in self.parts
        )

    def step_parts(self, rows: int) -> list[StepPart] | None:
        found = [part.step_parts(rows) for part in self.parts]
        if any(parts is None for parts in found):
            return None
        return [step for parts in found if parts is not None for step in parts]

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)


def _scratch_weight(rows: int, columns: int) -> torch.Tensor:
    """A bfloat16 ``[rows, columns]`` view of the thread's scratch buffer (grown as needed): reused,
    since a fresh tensor's pages cost as much as the copy into them."""
    size = rows * columns
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.numel() < size:
        buffer = _scratch.buffer = torch.empty(size, dtype=torch.bfloat16)
    return buffer[:size].view(rows, columns)


def choose_bfloat16_prefill(linears: Sequence[object], repeats: int = 3) -> list[str]:
    """Which block types' long prefill chunks (:data:`inference.weights.BFLOAT16_PREFILL_ROWS` rows
    and more) run in bfloat16, on a copy of the blocks made for each such call and oneDNN's product,
    among the :class:`GGMLLinear` layers of ``linears`` (stacked parts included); sets those layers'
    ``bfloat16_rows`` and returns the types' names.  Only where the CPU runs bfloat16 natively
    (:func:`inference.weights.bfloat16_prefill_available`); per type, a timing of its largest layer at
    :data:`inference.weights.PREFILL_TIMING_ROWS` rows, the two forms taking turns, must find the copy
    and its product under :data:`inference.weights.BFLOAT16_PREFILL_GAIN` of our products' time (a
    type whose products beat oneDNN's, as Q4_K's panels do with AVX-512 VNNI, keeps them).  Rounds x
    and the weights to bfloat16 there: a prompt's log-probabilities then depend on its chunks."""
    blocks = [
        part
        for linear in linears
        for part in (linear.parts if isinstance(linear, StackedLinear) else [linear])
        # Interleaved Q4_K keeps its 8-bit products at every row count (its bfloat16 copy restores the stored blocks first).
        if isinstance(part, GGMLLinear) and part.kind not in (F32, F16, BF16, Q4_K_X8)
    ]
    if not blocks or not bfloat16_prefill_available():
        return []
    chosen = []
    for kind in sorted({linear.kind for linear in blocks}):
        of_kind = [linear for linear in blocks if linear.kind == kind]
        if _bfloat16_is_faster(max(of_kind, key=lambda linear: linear.out_features * linear.in_features), repeats):
            chosen.append(type_name(kind))
            for linear in of_kind:
                linear.bfloat16_rows = BFLOAT16_PREFILL_ROWS
    return chosen


def _bfloat16_is_faster(largest: GGMLLinear, repeats: int) -> bool:
    x = torch.randn(PREFILL_TIMING_ROWS, largest.in_features, generator=torch.Generator().manual_seed(0))
    best = {"ours": float("inf"), "bfloat16": float("inf")}
    with torch.inference_mode():
        for repeat in range(repeats + 1):  # the first of each a warm-up
            for name in ("ours", "bfloat16") if repeat % 2 else ("bfloat16", "ours"):
                largest.bfloat16_rows = 1 if name == "bfloat16" else None
                started = time.perf_counter()
                largest(x)
                if repeat:
                    best[name] = min(best[name], time.perf_counter() - started)
    largest.bfloat16_rows = None
    chosen = best["bfloat16"] < BFLOAT16_PREFILL_GAIN * best["ours"]
    logger.info(
        "%s prefill chunks of %d rows and more: %s (a %d x %d layer at %d rows: ours %.1f ms, bfloat16 copy %.1f ms)",
        largest.format.upper(),
        BFLOAT16_PREFILL_ROWS,
        "bfloat16" if chosen else "our block products",
        largest.out_features,
        largest.in_features,
        PREFILL_TIMING_ROWS,
        best["ours"] * 1e3,
        best["bfloat16"] * 1e3,
    )
    return chosen
