"""Our CPU kernels, built at first use: products with block-quantized weights (``csrc/block_gemm.cpp``)
and the small operations of a decode step (``csrc/decode_ops.cpp``).

torch's weight-only kernels compute in bfloat16 activations and, on an AVX2 CPU, spend about
three times a 4-bit weight's read time unpacking it (docs/performance.md#why-our-own-kernels).
These kernels keep llama.cpp's block layouts (Q4_1: 4-bit values, a scale and a minimum per group
of 32; Q8_0: 8-bit values and a scale per group) and compute in float32 activations, so a layer
built from a GGUF's own blocks computes what the float32 model computes, up to summation order (on
the AVX2 code, the one-row products and products of 5 rows and more round the activations to 16
bits per group of 32 and multiply in integers: :meth:`CPUKernels.set_activation_bits`).

The decode step's small operations (RMSNorm, SiLU times up, rotary embeddings with the cache write
and attention over a float32 or float16 cache) are one call each here where torch takes several, as
is a prefill pass's attention per layer (:meth:`CPUKernels.prefill_attention`):
with the products this fast, torch's per-operation cost was half of a batch-1 step; and a step
whose products all run on our block kernels is one call in all (:meth:`CPUKernels.decode_layers`).

The C++ sources are compiled once per source text, compiler and flags with the C++ compiler
(``$CXX``, else ``c++``/``g++``), ``-O3 -mavx2 -mfma -mf16c``, into ``<cache_dir>/kernels/``, and
loaded with ctypes.  The block products also have AVX-512 versions (16-float vectors, faster:
docs/performance.md#which-cpu-features-matter), used where :func:`avx512_products` says.  Their
threads are their own (``csrc/pool.h``: a worker spins briefly after a kernel, then sleeps), not
libgomp's: with the server's ``OMP_WAIT_POLICY=PASSIVE`` each OpenMP region paid a wake-up
(docs/performance.md#why-our-own-kernels).  :func:`load` returns None where the CPU lacks
AVX2, FMA or F16C, torch's capability is below AVX2 (``ATEN_CPU_CAPABILITY=default``), no compiler is
found, or the build fails: the engine then uses torch's formats and operations.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import operator
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (CSRC / "block_gemm.cpp", CSRC / "decode_ops.cpp", CSRC / "ggml_blocks.cpp")
HEADERS = tuple(sorted(CSRC.glob("*.h")))  # in the build's digest
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-pthread", "-shared", "-fPIC", "-fvisibility=hidden", "-std=c++17")
GROUP = 32
ACTIVATION_BITS = (32, 16, 8)  # what the AVX2 block products may round x to (set_activation_bits)
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
AVX512_CPU_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
# ggml's types that ggml_gemm and ggml_dequantize_rows take (gguf.GGMLQuantizationType's ids): weights
# a block and bytes a block (gguf.GGML_QUANT_SIZES).
Q4_K_X8 = 112  # not ggml's: Q4_K interleaved by 8 rows (CPUKernels.interleave_q4_k)
GGML_BLOCKS = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    30: (1, 2),  # BF16
    Q4_K_X8: (256, 144),
}
# The whole-step table (:meth:`CPUKernels.decode_layers`): 10 fields a layer, then 4 products of
# STEP_PARTS parts of 5 fields (the kinds: weights.STEP_Q4_1 and the others).
STEP_PARTS = 3
STEP_TABLE_FIELDS = 10 + 4 * STEP_PARTS * 5
_GGML_DTYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}  # the unquantized types' elements

_lock = threading.Lock()
_loaded: dict[Path, CPUKernels | None] = {}
_settings: tuple[int, bool] | None = None  # configure's (activation bits, K-quant int8), for later loads


class CPUKernels:
    """The loaded library.  Tensors given are float32 (int8/uint8 for quantized values), contiguous
    and on the CPU unless said otherwise; the callers own them (nothing is checked: a wrong shape
    reads or writes out of bounds).  Threads: torch's count at each call.  Its state: the library's
    process-wide choices (``avx512``, ``vnni``, ``activation_bits``) and what the load's self-check found."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        pointer, size, integer, real = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float

        def function(name: str, *argtypes):
            bound = getattr(library, name)
            bound.argtypes, bound.restype = list(argtypes), None
            return bound

        self._q4_1 = function(
            "q4_1_gemm", pointer, size, size, pointer, pointer, pointer, size, pointer, integer, integer
        )
        self._q8_0 = function("q8_0_gemm", pointer, size, size, pointer, pointer, size, pointer, integer, integer)
        self._q4_1_to_bfloat16 = function("q4_1_to_bfloat16", pointer, pointer, pointer, size, size, pointer, integer)
        self._set_avx512 = function("set_avx512", integer)
        self._ggml_gemm = function("ggml_gemm", integer, pointer, size, size, pointer, size, pointer, integer, integer)
        self._ggml_gemm_parts = function(
            "ggml_gemm_parts", integer, pointer, pointer, pointer, pointer, size, size, pointer, size, integer, integer
        )
        self._ggml_gemm_parts.restype = ctypes.c_int
        self._ggml_dequantize_rows = function(
            "ggml_dequantize_rows", integer, pointer, size, size, pointer, size, pointer
        )
        self._ggml_dequantize_rows.restype = ctypes.c_int
        self._ggml_interleave_q4_k = function("ggml_interleave_q4_k", pointer, size, size, pointer, integer)
        self._ggml_interleave_q4_k.restype = ctypes.c_int
        self._ggml_to_bfloat16 = function("ggml_to_bfloat16", integer, pointer, size, size, pointer, integer)
        self._ggml_to_bfloat16.restype = ctypes.c_int
        self._ggml_set_avx512 = function("ggml_set_avx512", integer)
        self._set_activation_bits = function("set_activation_bits", integer)
        self._ggml_set_k_quant_int8 = function("ggml_set_k_quant_int8", integer)
        self.k_quant_int8 = False  # the library's own default
        self.k_quant_int8_available = True  # until the load's self-check says otherwise
        self._set_vnni = function("set_vnni", integer)
        self._set_vnni.restype = ctypes.c_int
        self.vnni = self.set_vnni(True)  # where the CPU has it
        self.avx512 = False
        self.set_avx512(avx512_products())
        self.activation_bits = 16  # the library's own default
        self.activation_bits_available = set(ACTIVATION_BITS)  # until the load's self-check says otherwise
        self._rms_norm = function("rms_norm", pointer, size, size, pointer, real, pointer)
        self._glu_mul = function("glu_mul", pointer, size, size, pointer, integer, integer, integer)
        self._prompt_logprobs = function(
            "prompt_logprobs", pointer, size, size, pointer, pointer, pointer, pointer, integer
        )
        self._copy_cache_rows = function(
            "copy_cache_rows", pointer, size, size, size, size, size, size, pointer, pointer, pointer, size, size
        )
        layers_types = (pointer, size, size, pointer, size, size, size, size, size, real, pointer, pointer, pointer)
        self._decode_layers = {
            torch.float32: function("decode_layers_f32", *layers_types, size, size, real, real, integer, integer),
            torch.float16: function("decode_layers_f16", *layers_types, size, size, real, real, integer, integer),
        }
        fields = function("decode_layers_fields")
        fields.restype = ctypes.c_int64
        if fields() != STEP_TABLE_FIELDS:
            raise RuntimeError(f"the library's decode step table has {fields()} fields, not {STEP_TABLE_FIELDS}")
        attention_types = (pointer, size, size, size, size, pointer, pointer, pointer, pointer, pointer, size, size)
        self._attention = {
            torch.float32: function("decode_attention", *attention_types, real, pointer, integer, size, real),
            torch.float16: function("decode_attention_f16", *attention_types, real, pointer, integer, size, real),
        }
        prefill_types = (pointer, size, pointer, size, size, size, pointer, pointer, real, pointer, integer)
        self._prefill_attention = {
            torch.float32: function("prefill_attention", *prefill_types),
            torch.float16: function("prefill_attention_f16", *prefill_types),
        }
        for bound in self._prefill_attention.values():
            bound.restype = ctypes.c_int

    def set_avx512(self, on: bool) -> None:
        """Run the block products' AVX-512 versions (``on``; only where :func:`avx512_products` says
        the CPU has them) or their AVX2 ones, from the next call on, in every thread.  The engine
        keeps the choice made at load; tests and benchmarks compare the two."""
        self.avx512 = bool(on)
        self._set_avx512(int(self.avx512))
        self._ggml_set_avx512(int(self.avx512))

    def set_vnni(self, on: bool) -> bool:
        """Whether the AVX-512 products of 7 rows and more multiply their 16-bit activations with
        AVX-512 VNNI's ``vpdpwssd`` (multiply, sum pairs and accumulate in one instruction; on at load
        where the CPU has it, and never where it has not) or with ``vpmaddwd`` and ``vpaddd`` (equal
        results: the sums are exact integers).  For tests and benchmarks; returns the choice made."""
        self.vnni = bool(self._set_vnni(int(bool(on))))
        return self.vnni

    def set_activation_bits(self, bits: int) -> None:
        """What the block products on the AVX2 code round their activations to, in every thread from
        the next call on: ``16`` (the library's default and the engine's) rounds them per group of 32
        and multiplies with integer instructions in the one-row products of both formats (a
        one-stream decode step, or a prefill chunk of one token) and in their products of 5 rows and more
        (``csrc/block_gemm.cpp``'s ROUNDED_ROWS; products of 2 to 4 rows stay float32: a request's
        tokens may differ alone and in a batch); ``8`` rounds the one-row Q4_1 product to 8 bits, as
        llama.cpp's AVX2 q4_1 dot product (``ENGINE_Q8_ACTIVATIONS=on``), the other products (the
        one-row Q8_0 product, those of 5 rows and more) to 16; ``32`` keeps them all float32.  16 bits: a product's relative error about 1e-5,
        the likelihood of text unchanged (bench/activation_bits_quality.py); 8 bits: about 1e-2,
        greedy text diverges sooner (docs/performance.md#output-quality-of-the-weight-formats).  Both
        make the products faster (docs/performance.md#why-our-own-kernels).  The AVX-512 products
        round to 16 bits from 7 rows on (VNNI's integer multiply-adds where the CPU has them), under 16
        and 8 alike.  Raises
        ``ValueError`` for other values; a width whose products failed the load's self-check falls
        back to float32 (logged).  Process-wide: the last engine started in a process sets it for all.
        """
        bits = operator.index(bits)
        if bits not in ACTIVATION_BITS:
            raise ValueError(f"activation bits must be one of {ACTIVATION_BITS}, not {bits!r}")
        if bits not in self.activation_bits_available:
            logger.warning("The %d-bit activations' product gives wrong results here; keeping float32", bits)
            bits = 32
        self.activation_bits = bits
        self._set_activation_bits(bits)

    def set_k_quant_int8(self, on: bool) -> None:
        """Whether the K-quant products (Q4_K, Q5_K, Q6_K as GGUF stores them) of any rows round x
        to 8 bits per 256 where the activation bits are 16 (``csrc/ggml_int8.h``: the form of
        llama.cpp's own K-quant dot products), as they do where
        they are 8; 32 keeps them float32 either way.  About twice the speed of their 16-bit
        products; the likelihood cost is in docs/performance.md (bench/activation_bits_quality.py).
        Off at load; the engine's ``k_quant_int8`` turns it on.  Process-wide, every thread."""
        if on and not self.k_quant_int8_available:
            logger.warning("The K-quants' 8-bit products give wrong results here; keeping 16 bits")
            on = False
        self.k_quant_int8 = bool(on)
        self._ggml_set_k_quant_int8(int(self.k_quant_int8))

    def q4_1(
        self, x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [M, K]`` times the Q4_1 weight ``[N, K]``, transposed: ``[M, N]``.

        ``qs`` ``[N, K / 2]`` uint8 (ggml's nibble order per group), ``d``/``m`` ``[N, K / 32]``.
        ``x`` is made contiguous float32 if it is not.  ``out`` given (``[M, N]``): the product is
        added into it in place (a residual stream) and it is returned.
        """
        x = x.contiguous() if x.dtype == torch.float32 else x.float().contiguous()
        rows, width = x.shape
        add = out is not None
        out = torch.empty(rows, d.shape[0], dtype=torch.float32) if out is None else out
        self._q4_1(
            x.data_ptr(), rows, width, qs.data_ptr(), d.data_ptr(), m.data_ptr(), d.shape[0], out.data_ptr(), add,
            torch.get_num_threads(),
        )  # fmt: skip
        return out

    def q8_0(self, x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x [M, K]`` times the Q8_0 weight ``[N, K]`` (``qs`` int8 ``[N, K]``, ``d`` ``[N, K / 32]``), transposed; ``out`` as for :meth:`q4_1`."""
        x = x.contiguous() if x.dtype == torch.float32 else x.float().contiguous()
        rows, width = x.shape
        add = out is not None
        out = torch.empty(rows, d.shape[0], dtype=torch.float32) if out is None else out
        self._q8_0(
            x.data_ptr(), rows, width, qs.data_ptr(), d.data_ptr(), d.shape[0], out.data_ptr(), add,
            torch.get_num_threads(),
        )  # fmt: skip
        return out

    def q4_1_to_bfloat16(self, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The Q4_1 weight ``[N, K]`` (``qs``, ``d``, ``m`` as for :meth:`q4_1`) as a new bfloat16 tensor,
        each ``d q + m`` rounded to nearest even as torch's cast does.  Raises ``RuntimeError`` on a
        CPU without the AVX-512 products (:func:`avx512_products`), where the kernel cannot run."""
        if not avx512_products():  # cached: cpuinfo is read once
            raise RuntimeError("q4_1_to_bfloat16 needs the AVX-512 products")
        rows, width = d.shape[0], d.shape[1] * GROUP
        out = torch.empty(rows, width, dtype=torch.bfloat16)
        self._q4_1_to_bfloat16(
            qs.data_ptr(), d.data_ptr(), m.data_ptr(), rows, width, out.data_ptr(), torch.get_num_threads()
        )
        return out

    def ggml_gemm(
        self, x: torch.Tensor, weight: torch.Tensor, ggml_type: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [M, K]`` times a weight stored as ggml blocks, transposed: ``[M, N]`` float32
        (``csrc/ggml_blocks.cpp``; the layouts: ggml's ``ggml-common.h``).

        ``weight``: uint8 ``[N, row bytes]``, contiguous, each row ``K / block`` blocks of
        ``ggml_type`` (a ``gguf.GGMLQuantizationType`` id of :data:`GGML_BLOCKS`), as a GGUF stores it
        (a view of the mapped file: it is read, never copied).  Computes ``x @ dequantize(weight).T``
        in float32, up to the order of sums.  ``x`` is made contiguous float32 if it is not.  ``out``
        given (``[M, N]``): the product is added into it and it is returned.  Raises ``ValueError``
        for another type or a row size that does not match ``K``.
        """
        block, size = _ggml_block(ggml_type)
        x = x.contiguous() if x.dtype == torch.float32 else x.float().contiguous()
        rows, width = x.shape
        _check_ggml_weight(weight, ggml_type, width, block, size)
        if ggml_type in _GGML_DTYPES and width % GROUP:  # the kernel's unquantized rows go 32 at a time
            product = x @ weight.view(_GGML_DTYPES[ggml_type]).float().T
            return product if out is None else out.add_(product)
        add = out is not None
        out = torch.empty(rows, weight.shape[0], dtype=torch.float32) if out is None else out
        self._ggml_gemm(
            ggml_type, x.data_ptr(), rows, width, weight.data_ptr(), weight.shape[0], out.data_ptr(), add,
            torch.get_num_threads(),
        )  # fmt: skip
        return out

    @property
    def k_quants_in_int8(self) -> bool:
        """Whether the K-quants' products round x to 8 bits (``csrc/ggml_blocks.cpp``'s
        ``k_quants_in_int8``): activations at 8 bits, or at 16 with :meth:`set_k_quant_int8`."""
        return self.activation_bits == 8 or (self.activation_bits == 16 and self.k_quant_int8)

    def interleave_q4_k(self, weight: torch.Tensor) -> torch.Tensor:
        """A Q4_K weight (uint8 ``[N, row bytes]`` as :meth:`ggml_gemm` takes it) interleaved by 8
        rows: the same bytes rearranged (``csrc/ggml_interleaved.h`` has the layout), of the same
        shape, for :meth:`ggml_gemm` as type :data:`Q4_K_X8`, whose products round x to 8 bits at any
        row count (as the K-quants' with :meth:`set_k_quant_int8`; in float32 where x cannot be
        rounded) with a weight row in each lane: llama.cpp's repacking of Q4_K for its CPU backend, in
        our own byte order: a new tensor.  Raises ``ValueError`` unless N is a multiple of 8 and the
        rows hold whole super-blocks."""
        block, size = _ggml_block(12)
        if weight.dtype != torch.uint8 or weight.dim() != 2 or not weight.is_contiguous() or weight.shape[1] % size:
            raise ValueError(f"interleave_q4_k takes contiguous uint8 rows of Q4_K blocks, not {tuple(weight.shape)}")
        rows, width = weight.shape[0], weight.shape[1] // size * block
        out = torch.empty_like(weight)
        if not self._ggml_interleave_q4_k(weight.data_ptr(), rows, width, out.data_ptr(), torch.get_num_threads()):
            raise ValueError(f"interleave_q4_k takes a multiple of 8 rows, not {rows}")
        return out

    def ggml_gemm_parts(self, x: torch.Tensor, parts: Sequence[tuple[torch.Tensor, int]]) -> torch.Tensor | None:
        """``x [M, K]`` times several weights, as :meth:`ggml_gemm` takes each (``(weight, ggml_type)``),
        their products side by side: ``[M, sum of N]`` float32, equal to :meth:`ggml_gemm`'s part by
        part, in one parallel region where every part takes the 8-bit tiles at ``M`` rows (a K-quant,
        x rounded to 8 bits, fewer rows than the panels take: a layer's q/k/v or gate/up in a decode
        step); None, nothing computed, otherwise.  Raises ``ValueError`` as :meth:`ggml_gemm`."""
        x = x.contiguous() if x.dtype == torch.float32 else x.float().contiguous()
        rows, width = x.shape
        for weight, ggml_type in parts:
            block, size = _ggml_block(ggml_type)
            _check_ggml_weight(weight, ggml_type, width, block, size)
        count = len(parts)
        types = (ctypes.c_int * count)(*(ggml_type for _, ggml_type in parts))
        weights = (ctypes.c_void_p * count)(*(weight.data_ptr() for weight, _ in parts))
        columns = (ctypes.c_int64 * count)(*(weight.shape[0] for weight, _ in parts))
        out = torch.empty(rows, sum(columns), dtype=torch.float32)
        done = self._ggml_gemm_parts(
            count, types, weights, columns, x.data_ptr(), rows, width, out.data_ptr(), out.shape[1], 0,
            torch.get_num_threads(),
        )  # fmt: skip
        return out if done else None

    def ggml_to_bfloat16(
        self, weight: torch.Tensor, ggml_type: int, K: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A block-quantized ``weight`` (uint8 ``[N, row bytes]``, as :meth:`ggml_gemm` takes it) as
        bfloat16 ``[N, K]``: its dequantized values rounded to nearest even, as torch's cast rounds
        them; into ``out`` (contiguous bfloat16 ``[N, K]``) where given, else a new tensor.  Raises
        ``ValueError`` for a float type or one the kernels lack."""
        block, size = _ggml_block(ggml_type)
        _check_ggml_weight(weight, ggml_type, K, block, size)
        if out is None:
            out = torch.empty(weight.shape[0], K, dtype=torch.bfloat16)
        done = self._ggml_to_bfloat16(
            ggml_type, weight.data_ptr(), weight.shape[0], K, out.data_ptr(), torch.get_num_threads()
        )
        if not done:
            raise ValueError(f"no bfloat16 copy of ggml type {ggml_type} here")
        return out

    def ggml_dequantize_rows(self, weight: torch.Tensor, ggml_type: int, K: int, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` (int64 ``[n]``) of a ggml-block weight (``weight`` as for :meth:`ggml_gemm`,
        ``K`` values a row) as float32 ``[n, K]``, each value as gguf-py's ``dequantize`` gives it (an
        embedding lookup; one thread).  Raises ``ValueError`` as :meth:`ggml_gemm` does, and
        ``IndexError`` for a row out of range."""
        block, size = _ggml_block(ggml_type)
        _check_ggml_weight(weight, ggml_type, K, block, size)
        rows = rows.to(torch.int64).contiguous()
        out = torch.empty(rows.numel(), K, dtype=torch.float32)
        if not self._ggml_dequantize_rows(
            ggml_type, weight.data_ptr(), weight.shape[0], K, rows.data_ptr(), rows.numel(), out.data_ptr()
        ):
            raise IndexError(f"rows out of range for a weight of {weight.shape[0]} rows")
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of ``x [rows, width]`` with scales ``weight [width]``: a new ``[rows, width]``
        (``weight * (x / sqrt(mean(x^2) + eps))``, as transformers' LlamaRMSNorm in float32)."""
        out = torch.empty_like(x)
        self._rms_norm(x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), eps, out.data_ptr())
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``gate_up [rows, 2 * width]`` (gate first, contiguous, float32 or
        bfloat16): a new ``[rows, width]`` of its dtype, computed in float32 (a bfloat16 result
        rounded as torch's cast rounds)."""
        return self._glu(gate_up, gelu=False)

    def gelu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``gelu(gate) * up`` (GELU's tanh form, torch's ``approximate="tanh"``: Gemma's GeGLU) of
        ``gate_up [rows, 2 * width]`` (gate first), as :meth:`silu_mul` takes and gives it."""
        return self._glu(gate_up, gelu=True)

    def _glu(self, gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
        if gate_up.dtype not in (torch.float32, torch.bfloat16) or not gate_up.is_contiguous():
            raise ValueError(f"a GLU takes a contiguous float32 or bfloat16 gate/up, not {gate_up.dtype}")
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, width, dtype=gate_up.dtype)
        bfloat16 = gate_up.dtype == torch.bfloat16
        self._glu_mul(
            gate_up.data_ptr(), rows, width, out.data_ptr(), int(gelu), int(bfloat16), torch.get_num_threads()
        )
        return out

    def prompt_logprobs(
        self, logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row of ``logits`` (float32 ``[rows, vocab]``, contiguous): the log-probability of
        ``targets[row]`` (int64 ``[rows]``; NaN for an id outside the vocabulary) and the row's most
        likely token id and its log-probability, as ``log_softmax`` then ``topk(1)`` give them (up to
        float32 rounding; ties go to the first id).  Returns ``(target_logprobs, top_ids, top_logprobs)``,
        each ``[rows]``.  Raises ``ValueError`` for logits off the CPU, not float32 or not contiguous,
        and for a count of targets other than ``rows``."""
        if not prompt_logprobs_takes(logits):
            raise ValueError(
                "prompt_logprobs takes contiguous float32 [rows, vocab] logits on the CPU, not "
                f"{logits.dtype} {tuple(logits.shape)} of strides {logits.stride()} on {logits.device}"
            )
        rows, vocab = logits.shape
        targets = targets.to("cpu", torch.int64).contiguous()
        if targets.shape != (rows,):
            raise ValueError(f"prompt_logprobs takes one target a row: {rows} rows, targets {tuple(targets.shape)}")
        # float32 as the kernel writes them, whatever torch's default dtype is then.
        target_logprobs = torch.empty(rows, dtype=torch.float32)
        top_logprobs = torch.empty(rows, dtype=torch.float32)
        top_ids = torch.empty(rows, dtype=torch.int64)
        self._prompt_logprobs(
            logits.data_ptr(),
            rows,
            vocab,
            targets.data_ptr(),
            target_logprobs.data_ptr(),
            top_ids.data_ptr(),
            top_logprobs.data_ptr(),
            torch.get_num_threads(),
        )
        return target_logprobs, top_ids, top_logprobs

    def copy_cache_rows(
        self,
        targets: torch.Tensor,
        capacity: int,
        row: int,
        copies: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        length: int,
    ) -> bool:
        """Copy positions ``[0, length)`` of a prefilled cache into rows ``row .. row + copies - 1`` of
        the running batch's caches; returns False (nothing copied) where the layouts do not allow it.

        ``targets``: int64 ``[2 * layers]``, the addresses of each layer's key buffer, then each
        layer's value buffer, all ``[row capacity, kv_heads, capacity, dim]`` contiguous, of
        ``keys``' dtype (float16 or float32), with room for those rows and ``length`` columns (the caller's).
        ``keys``/``values``: ``[layers, kv_heads, positions, dim]``, the same strides, ``dim``
        contiguous.  Releases the GIL while it copies.
        """
        if keys.dtype not in (torch.float16, torch.float32) or keys.stride() != values.stride() or keys.stride(3) != 1:
            return False
        layers, kv_heads, _, dim = keys.shape
        if targets.numel() != 2 * layers:
            return False
        strides = torch.tensor(keys.stride()[:3], dtype=torch.int64)
        self._copy_cache_rows(
            targets.data_ptr(), layers, row, copies, kv_heads, capacity, dim, keys.data_ptr(), values.data_ptr(),
            strides.data_ptr(), length, keys.element_size(),
        )  # fmt: skip
        return True

    def decode_attention(
        self,
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        window: int | None = None,
        softcap: float | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """A decode step's attention for ``qkv [rows, (heads + 2 kv_heads) * dim]`` (queries, keys, values).

        ``cos``/``sin``: the rotary tables ``[positions, dim]`` (sin's first half negated, see
        :meth:`inference.llama.LlamaModelRunner._rope_table`); ``positions``: int64 ``[rows]``, the
        new token's position per row.  ``keys``/``values``: the layer's caches
        ``[row capacity, kv_heads, capacity, dim]``, float32 or float16 (rounded to nearest even, as
        torch casts); each row's new key (rotated) and value are written at its position, then its
        queries (rotated) attend over positions ``0..position``, in float32, or over its last
        ``window`` positions (a sliding window, the query's own included) where ``window`` is given.
        Scores are ``scale`` (default ``dim ** -0.5``) times the dot products, soft-capped to
        ``softcap * tanh(score / softcap)`` where ``softcap`` is given (Gemma 2's).  Returns ``[rows,
        heads * dim]``.  ``dim`` must be even and at most 256.
        """
        rows, dim = qkv.shape[0], keys.shape[-1]
        out = torch.empty(rows, heads * dim, dtype=torch.float32)
        self._attention[keys.dtype](
            qkv.data_ptr(), rows, heads, kv_heads, dim, cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
            keys.data_ptr(), values.data_ptr(), keys.stride(0), keys.stride(1),
            dim**-0.5 if scale is None else scale, out.data_ptr(), torch.get_num_threads(), window or 0, softcap or 0.0,
        )  # fmt: skip
        return out

    def prefill_attention(
        self,
        qkv: torch.Tensor,
        sequences: torch.Tensor,
        heads: int,
        kv_heads: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_dtype: torch.dtype,
        out: torch.Tensor,
    ) -> bool:
        """A prefill pass's attention for one layer, in one call: each sequence's new keys (rotated)
        and values written into its caches, then causal grouped-query attention of its queries
        (rotated) over its positions, flash attention's online softmax in float32 (``csrc/decode_ops.cpp``).

        ``qkv``: ``[tokens, (heads + 2 kv_heads) * dim]``, the pass's rows (its queries are rotated and
        scaled in place); ``sequences``: int64 ``[count, 6]``, per sequence its first row in ``qkv``
        (the sequences' rows follow one another), its rows, the positions cached before them, the caches' head stride (elements) and the
        addresses of its key and value caches for this layer (``[kv_heads, capacity, dim]`` of
        ``kv_dtype``, float32 or float16); ``cos``/``sin`` as :meth:`decode_attention` takes them;
        ``out``: ``[tokens, heads * dim]``.  Returns False, nothing done, unless ``dim`` is 64, 96, 128 or 256
        and ``heads`` a multiple of ``kv_heads``.
        """
        dim = qkv.shape[1] // (heads + 2 * kv_heads)
        return bool(
            self._prefill_attention[kv_dtype](
                qkv.data_ptr(),
                sequences.shape[0],
                sequences.data_ptr(),
                heads,
                kv_heads,
                dim,
                cos.data_ptr(),
                sin.data_ptr(),
                dim**-0.5,
                out.data_ptr(),
                torch.get_num_threads(),
            )  # fmt: skip
        )

    def decode_layers(
        self,
        x: torch.Tensor,
        table: torch.Tensor,
        heads: int,
        kv_heads: int,
        intermediate: int,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        keys: torch.Tensor,
        scale: float | None = None,
        softcap: float | None = None,
        gelu: bool = False,
    ) -> None:
        """A decode step's decoder layers in one call, each as LlamaModelRunner's fused step runs it
        (RMSNorm, q/k/v with its bias and per-head q/k RMSNorms where given, :meth:`decode_attention`,
        o into the residual, RMSNorm, gate/up, :meth:`silu_mul`, down into the residual), every
        product on our block kernels.

        ``x``: the residual stream ``[rows, hidden]``, float32, updated in place.  ``table``: int64
        ``[layers, STEP_TABLE_FIELDS]``, per layer the ``data_ptr()`` of its input and post-attention
        RMSNorm scales, its query and key RMSNorm scales and q/k/v bias (0: none), its key and value
        caches, its sliding window (0: none), its attention and MLP output RMSNorm scales (Gemma's
        sandwich norms; 0: none), then per product (q/k/v, o, gate/up, down) up to
        :data:`STEP_PARTS` parts (:meth:`inference.weights.WeightLinear.step_parts`), their outputs
        side by side (``csrc/decode_ops.cpp``'s ``decode_layers_f32`` has the layout).  ``keys``:
        one layer's key cache, for the caches' strides and dtype (float32 or float16, every layer
        alike).  ``gelu``: :meth:`gelu_mul` instead of :meth:`silu_mul`.  The rest as
        :meth:`decode_attention` (``scale`` and ``softcap`` for every layer).
        """
        rows, hidden = x.shape
        dim = keys.shape[-1]
        self._decode_layers[keys.dtype](
            x.data_ptr(), rows, table.shape[0], table.data_ptr(), hidden, heads, kv_heads, dim, intermediate, eps,
            cos.data_ptr(), sin.data_ptr(), positions.data_ptr(), keys.stride(0), keys.stride(1),
            dim**-0.5 if scale is None else scale, softcap or 0.0, int(gelu), torch.get_num_threads(),
        )  # fmt: skip


def _ggml_block(ggml_type: int) -> tuple[int, int]:
    """A ggml type's weights and bytes a block; ``ValueError`` for a type the kernels lack."""
    if ggml_type not in GGML_BLOCKS:
        raise ValueError(f"no ggml block kernel for type {ggml_type}")
    return GGML_BLOCKS[ggml_type]


def _check_ggml_weight(weight: torch.Tensor, ggml_type: int, width: int, block: int, size: int) -> None:
    """Raises ``ValueError`` unless ``weight`` is contiguous uint8 rows of ``width`` values of the type."""
    if weight.dtype != torch.uint8 or weight.dim() != 2 or not weight.is_contiguous():
        raise ValueError(
            f"a ggml weight is a contiguous uint8 [rows, row bytes], not {weight.dtype} {tuple(weight.shape)}"
        )
    if width % block or weight.shape[1] != width // block * size:
        raise ValueError(f"ggml type {ggml_type} rows of {weight.shape[1]} bytes do not hold {width} values")


def avx512_products() -> bool:
    """Whether the block products run their AVX-512 versions: where the CPU has AVX-512 F, BW, DQ
    and VL and torch's own capability is AVX512, so that ``ATEN_CPU_CAPABILITY=avx2`` puts these
    kernels on their AVX2 code as it does torch's."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and all(flag in cpu_flags() for flag in AVX512_CPU_FLAGS)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none); read once a process
    (a large machine's cpuinfo takes a while to parse, and the bfloat16 prefill asks per call)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def unavailable_reason() -> str | None:
    """Why the kernels cannot run here (CPU, torch's capability), or None if they can; no build."""
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in cpu_flags()]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    capability = str(torch.backends.cpu.get_cpu_capability())
    if capability not in ("AVX2", "AVX512"):
        return f"torch's CPU capability is {capability} (ATEN_CPU_CAPABILITY)"
    return None


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        subprocess.run(
            [compiler, *FLAGS, "-o", str(partial), *map(str, SOURCES)],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        partial.replace(target)  # atomic: another process loads the whole file or builds its own
    finally:
        partial.unlink(missing_ok=True)


DEFAULT_CACHE_DIR = Path(".cache/models")


def configure(activation_bits: int, k_quant_int8: bool) -> None:
    """The process's :meth:`CPUKernels.set_activation_bits` and :meth:`CPUKernels.set_k_quant_int8`,
    for the kernels loaded now and at their load: the engine sets them before the model loads, so
    that the load's timings (the bfloat16 prefill's choice) time the products the engine will run.
    Raises ``ValueError`` for bits not in :data:`ACTIVATION_BITS`."""
    if activation_bits not in ACTIVATION_BITS:
        raise ValueError(f"activation bits must be one of {ACTIVATION_BITS}, not {activation_bits!r}")
    global _settings
    with _lock:
        _settings = (activation_bits, bool(k_quant_int8))
        for kernels in _loaded.values():
            if kernels is not None:
                _apply_settings(kernels)


def _apply_settings(kernels: CPUKernels) -> None:
    if _settings is not None:
        kernels.set_activation_bits(_settings[0])
        kernels.set_k_quant_int8(_settings[1])


def prompt_logprobs_takes(logits: torch.Tensor) -> bool:
    """Whether :meth:`CPUKernels.prompt_logprobs` takes ``logits``: contiguous float32 ``[rows,
    vocab]`` on the CPU, as it reads them through a raw pointer (a GPU's logits keep torch's path)."""
    return (
        logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2 and logits.is_contiguous()
    )


def loaded() -> CPUKernels | None:
    """The kernels an earlier :func:`load` of this process loaded, without loading them."""
    with _lock:
        return next((kernels for kernels in _loaded.values() if kernels is not None), None)


def load(cache_dir: Path | None = DEFAULT_CACHE_DIR) -> CPUKernels | None:
    """The kernels, built into ``cache_dir/kernels`` at the first call of a process (a cached build
    is reused); None, with the reason logged once, where they cannot run or be built.

    ``cache_dir`` None: whatever an earlier call of this process loaded, else the default
    (``.cache/models``): the weight formats' builders call it so, after the engine loaded them from
    its configured cache.
    """
    with _lock:
        if cache_dir is None:
            if _loaded:
                return next(iter(_loaded.values()))
            cache_dir = DEFAULT_CACHE_DIR
        cache_dir = Path(cache_dir).resolve()
        if cache_dir not in _loaded:
            _loaded[cache_dir] = _load(cache_dir)
        return _loaded[cache_dir]


def _load(cache_dir: Path) -> CPUKernels | None:
    reason = unavailable_reason()
    compiler = _compiler()
    if reason is None and compiler is None:
        reason = "no C++ compiler (c++, g++ or $CXX) is installed"
    if reason is not None:
        logger.info("CPU kernels unavailable: %s; torch's weight formats only", reason)
        return None
    assert compiler is not None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        sources = b"".join(source.read_bytes() for source in (*SOURCES, *HEADERS))
        digest = hashlib.sha256(sources + version.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
        target = cache_dir / "kernels" / f"cpu_kernels-{digest}.so"
        if not target.exists():
            _build(compiler, target)
            logger.info("Built the CPU kernels into %s", target)
        kernels = CPUKernels(ctypes.CDLL(str(target)), target)
        if not _works(kernels):
            logger.warning("CPU kernels in %s give wrong results; torch's weight formats only", target)
            return None
        _apply_settings(kernels)
        return kernels
    except (OSError, subprocess.SubprocessError, AttributeError) as error:
        detail = getattr(error, "stderr", "") or ""
        logger.warning("CPU kernels could not be built (%s) %s; torch's weight formats only", error, detail)
        return None


def _works(kernels: CPUKernels) -> bool:
    """Small products of each kernel against torch's float32 at 1 to 20 rows (the one-row paths, full
    blocks of 8 rows and their rest), then the products with 16- and 8-bit activations (one row, and
    tiles of 8 or 16 rows with their rest), on the AVX2 code and the AVX-512 one (its 8-row tiles
    and 16-row ones, with VNNI and without, where the CPU has them).  The decode operations are
    checked by the tests only."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(20, 64, generator=generator)
    q = torch.randint(0, 16, (24, 64), dtype=torch.uint8, generator=generator)
    d, m = torch.rand(24, 2, generator=generator), torch.randn(24, 2, generator=generator)
    weight = (q.float().reshape(24, 2, GROUP) * d[..., None] + m[..., None]).reshape(24, 64)
    nibbles = q.reshape(24, 2, 2, GROUP // 2)
    qs = (nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)).reshape(24, 32).contiguous()
    q8 = torch.randint(-127, 128, (24, 64), dtype=torch.int8, generator=generator)
    weight8 = (q8.float().reshape(24, 2, GROUP) * d[..., None]).reshape(24, 64)
    avx512 = kernels.avx512
    close = True
    kernels._set_activation_bits(32)  # the float32 products first
    for rows in (1, 2, 3, 8, 11, 12, 20):
        close &= torch.allclose(kernels.q4_1(x[:rows], qs, d, m), x[:rows] @ weight.T, rtol=1e-4, atol=1e-4)
        close &= torch.allclose(kernels.q8_0(x[:rows], q8, d), x[:rows] @ weight8.T, rtol=1e-4, atol=1e-4)
    # The AVX2 products with 16- and 8-bit activations (8: the one-row Q4_1 product; the rest round to 16):
    # within their rounding of the float32 product, or that width stays unavailable (the rest of the
    # kernels are still used).
    # The AVX-512 products round at 7 and 8 rows and from 9 rows on, with VNNI where the CPU has it and without.
    vnni = kernels.vnni
    for wide, with_vnni in ((False, False), (True, False), (True, True)):
        if wide and not avx512_products() or with_vnni and not vnni:
            continue
        kernels.set_avx512(wide)
        kernels.set_vnni(with_vnni)
        for bits, tolerance in ((16, 1e-3), (8, 3e-2)):
            kernels._set_activation_bits(bits)
            for rows in (1, 5, 7, 13, 20):
                for got, expected in (
                    (kernels.q4_1(x[:rows], qs, d, m), x[:rows] @ weight.T),
                    (kernels.q8_0(x[:rows], q8, d), x[:rows] @ weight8.T),
                ):
                    if not (got - expected).abs().max() <= tolerance * expected.abs().max():
                        kernels.activation_bits_available.discard(bits)
    kernels.set_vnni(vnni)
    kernels.set_avx512(avx512)
    kernels.set_activation_bits(kernels.activation_bits)  # the default, or float32 where it failed
    return bool(close) and _ggml_works(kernels)


def _rounded_per_256(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the K-quants' 8-bit products round it (``csrc/ggml_int8.h``'s RoundedX8)."""
    blocks = x.reshape(x.shape[0], -1, 256)
    scale = blocks.abs().amax(-1, keepdim=True) / 127.0
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return (torch.round(blocks * inverse) * scale).reshape(x.shape)


def _ggml_works(kernels: CPUKernels) -> bool:
    """The ggml block products, one small product per family (Q8_0, Q4_K, Q6_K) at 1, 3, 9 and 32 rows on
    each ISA the CPU has, with float32 activations and with 16-bit ones (the integer products of up
    to 4 rows), against torch's product of the kernels' own dequantized rows, and the K-quants' 8-bit
    products against x rounded as they round it; Q8_0's
    dequantized rows against torch's (its blocks built here).  The tests check every type against gguf-py."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 256, generator=generator)
    q8 = torch.randint(-127, 128, (8, 8, GROUP), dtype=torch.int8, generator=generator)
    d = (torch.rand(8, 8, 1, generator=generator) * 0.1).half()
    weights = {8: torch.cat([d.view(torch.uint8), q8.view(torch.uint8)], -1).reshape(8, -1)}
    for ggml_type in (12, 14):  # random bytes, float16 scales (Q4_K: d and dmin first; Q6_K: d last) small
        _, size = GGML_BLOCKS[ggml_type]
        # 40 weight rows: panels (csrc/ggml_panels.h's of 32 from 9 rows of x with VNNI, ggml_panels_avx2.h's
        # of 16 from 10 or 32) and 8 past them
        data = torch.randint(0, 256, (40, size), dtype=torch.uint8, generator=generator)
        scales = (torch.rand(40, 2, generator=generator) * 0.1).half().view(torch.uint8)
        data[:, -2:] = scales[:, :2]
        if ggml_type == 12:
            data[:, :4] = scales
        weights[ggml_type] = data
    avx512 = kernels.avx512
    close = True
    for wide in (False, True) if avx512_products() else (False,):
        kernels.set_avx512(wide)
        every = torch.arange(8)
        close &= torch.equal(
            kernels.ggml_dequantize_rows(weights[8], 8, 256, every), (q8.float() * d.float()).reshape(8, 256)
        )
        for ggml_type, data in weights.items():
            every = torch.arange(data.shape[0])
            dequantized = kernels.ggml_dequantize_rows(data, ggml_type, 256, every)
            for rows in (1, 3, 9, 32):
                expected = x[:rows] @ dequantized.T
                kernels._set_activation_bits(32)
                close &= torch.allclose(kernels.ggml_gemm(x[:rows], data, ggml_type), expected, rtol=1e-4, atol=1e-4)
                kernels._set_activation_bits(16)  # up to 4 rows: x rounded to 16 bits, within its rounding
                error = (kernels.ggml_gemm(x[:rows], data, ggml_type) - expected).abs().max()
                close &= bool(error <= 1e-3 * expected.abs().max())
                if ggml_type != 8:  # the K-quants' 8-bit products: unavailable where they fail
                    kernels._set_activation_bits(8)
                    expected = _rounded_per_256(x[:rows]) @ dequantized.T
                    if ggml_type == 12:  # the minimums meet x's exact sums: Q4_K's blocks with every q 0
                        minimums = kernels.ggml_dequantize_rows(
                            torch.cat([data[:, :16], data[:, 16:] * 0], 1), 12, 256, every
                        )
                        expected += (x[:rows] - _rounded_per_256(x[:rows])) @ minimums.T
                    error = (kernels.ggml_gemm(x[:rows], data, ggml_type) - expected).abs().max()
                    if not error <= 1e-4 * expected.abs().max():
                        kernels.k_quant_int8_available = False
    kernels._set_activation_bits(kernels.activation_bits)
    kernels.set_avx512(avx512)
    return bool(close)
