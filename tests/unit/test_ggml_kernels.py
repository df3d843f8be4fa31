"""The ggml block products (inference/cpu_kernels.py's ggml_gemm, csrc/ggml_blocks.cpp) compute
x @ dequantize(W).T with gguf-py's dequantizer as the reference, for every type they take.

The 32-weight types and the unquantized ones are quantized by gguf-py; the K-quants (which gguf-py
does not quantize) are random bytes with their float16 scales set in a real range.  Each product is
compared with float64's at row counts that cover the one-row path, the rests of the 8-row blocks
and several blocks, on the AVX2 code and (where the CPU has it) the AVX-512 code.  Skipped where
the kernels cannot run (no AVX2 or no C++ compiler).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from inference import cpu_kernels

KERNELS = cpu_kernels.load(None)
pytestmark = pytest.mark.skipif(KERNELS is None, reason=f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
T = gguf.GGMLQuantizationType
TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
ROWS = [1, 2, 5, 8, 33, 70]


def blocks(qtype: T, rows: int, width: int, seed: int = 0) -> np.ndarray:
    """A weight ``[rows, width]`` as GGUF stores it: uint8 ``[rows, row bytes]``."""
    rng = np.random.default_rng(seed)
    if qtype not in K_QUANTS:
        values = rng.standard_normal((rows, width)).astype(np.float32)
        stored = gguf.quants.quantize(values, qtype)
        return np.ascontiguousarray(stored).view(np.uint8).reshape(rows, -1)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    count = width // block
    data = rng.integers(0, 256, size=(rows, count, size), dtype=np.uint8)

    def scales() -> np.ndarray:  # float16 d (or dmin) in 1e-3 .. 1e-1
        return rng.uniform(1e-3, 1e-1, size=(rows, count)).astype(np.float16).view(np.uint8).reshape(rows, count, 2)

    if qtype == T.Q6_K:
        data[..., 208:210] = scales()  # the 16 int8 scales are any bytes
    else:
        data[..., 0:2], data[..., 2:4] = scales(), scales()  # d, dmin; the 6-bit scales are any bytes
    return data.reshape(rows, -1)


def reference(data: np.ndarray, qtype: T, width: int) -> np.ndarray:
    return gguf.quants.dequantize(data, qtype).reshape(data.shape[0], width)


def width_for(qtype: T) -> int:
    # K-quants: 3 super-blocks; the 32-weight types: 9 blocks (a step of 8, then one alone).
    return 768 if qtype in K_QUANTS else 288


def assert_product(got: torch.Tensor, x: torch.Tensor, weight: np.ndarray) -> None:
    expected = x.double().numpy() @ weight.astype(np.float64).T
    bound = 1e-5 * np.outer(np.linalg.norm(x.double().numpy(), axis=1), np.linalg.norm(weight, axis=1)) + 1e-30
    error = np.abs(got.double().numpy() - expected)
    assert (error <= bound).all(), f"worst error {float((error / bound).max()):.2f} of the bound"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_the_product_is_x_times_the_dequantized_weight(isa, qtype, rows):
    width = width_for(qtype)
    outputs = 40 if rows < 33 else 200  # 200 outputs of 33 rows and more: on several threads
    data = blocks(qtype, outputs, width)
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows))
    got = KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype))
    assert got.shape == (rows, outputs) and got.dtype == torch.float32
    assert_product(got, x, reference(data, qtype, width))


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K, T.F16], ids=lambda t: t.name)
def test_the_product_adds_into_out(isa, qtype):
    width = width_for(qtype)
    data = blocks(qtype, 24, width, seed=1)
    x = torch.randn(3, width, generator=torch.Generator().manual_seed(3))
    residual = torch.randn(3, 24, generator=torch.Generator().manual_seed(4))
    out = residual.clone()
    assert KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype), out=out) is out
    assert torch.allclose(out - residual, KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype)), atol=1e-5)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantized_rows_are_gguf_py_s_values(isa, qtype):
    width = width_for(qtype)
    data = blocks(qtype, 16, width, seed=2)
    rows = torch.tensor([3, 0, 15, 3], dtype=torch.int64)
    got = KERNELS.ggml_dequantize_rows(torch.from_numpy(data), int(qtype), width, rows)
    np.testing.assert_array_equal(got.numpy(), reference(data, qtype, width)[rows.numpy()])


@pytest.mark.parametrize(
    "qtype", [qtype for qtype in TYPES if qtype not in (T.F32, T.F16, T.BF16)], ids=lambda t: t.name
)
def test_a_bfloat16_copy_is_the_dequantized_weight_rounded_as_torch_rounds(isa, qtype):
    width = width_for(qtype)
    data = blocks(qtype, 37, width, seed=3)
    expected = torch.from_numpy(reference(data, qtype, width)).bfloat16()
    assert torch.equal(KERNELS.ggml_to_bfloat16(torch.from_numpy(data), int(qtype), width), expected)
    out = torch.full((37, width), float("nan"), dtype=torch.bfloat16)
    assert KERNELS.ggml_to_bfloat16(torch.from_numpy(data), int(qtype), width, out=out) is out
    assert torch.equal(out, expected)


def test_a_float_type_has_no_bfloat16_copy():
    with pytest.raises(ValueError):
        KERNELS.ggml_to_bfloat16(torch.from_numpy(blocks(T.F16, 2, 64)), int(T.F16), 64)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_unquantized_rows_of_any_width(isa, qtype):
    data = blocks(qtype, 8, 40, seed=5)
    x = torch.randn(2, 40, generator=torch.Generator().manual_seed(6))
    assert_product(KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype)), x, reference(data, qtype, 40))
    rows = torch.tensor([7, 1], dtype=torch.int64)
    got = KERNELS.ggml_dequantize_rows(torch.from_numpy(data), int(qtype), 40, rows)
    np.testing.assert_array_equal(got.numpy(), reference(data, qtype, 40)[[7, 1]])


def test_a_weight_that_does_not_fit_is_refused():
    data = torch.from_numpy(blocks(T.Q4_K, 4, 512))
    with pytest.raises(ValueError):
        KERNELS.ggml_gemm(torch.randn(1, 256), data, int(T.Q4_K))  # rows hold 512 values
    with pytest.raises(ValueError):
        KERNELS.ggml_gemm(torch.randn(1, 512), data, int(T.Q2_K))  # a type without a kernel
    with pytest.raises(IndexError):
        KERNELS.ggml_dequantize_rows(data, int(T.Q4_K), 512, torch.tensor([4]))
    with pytest.raises(IndexError):
        KERNELS.ggml_dequantize_rows(data, int(T.Q4_K), 512, torch.tensor([0, -1]))


def rounded(x: torch.Tensor, largest: float, group: int = 32) -> torch.Tensor:
    """``x`` as the integer products round it: per ``group``, scale ``max |x| / largest`` (32767
    for 16 bits, 127 for 8) and ``round(x * (1 / scale))`` to nearest even, in float32
    (``csrc/block_gemm.cpp``'s quantize_row, ``csrc/ggml_int8.h``'s RoundedX8 per 256)."""
    groups = x.reshape(x.shape[0], -1, group)
    scale = groups.abs().amax(-1, keepdim=True) / largest
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return (torch.round(groups * inverse) * scale).reshape(x.shape)


def rounded_to_16_bits(x: torch.Tensor) -> torch.Tensor:
    return rounded(x, 32767.0)


BLOCK_TYPES = [qtype for qtype in TYPES if qtype not in (T.F32, T.F16, T.BF16)]


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_few_rows_multiply_x_rounded_to_16_bits(isa, qtype, rows):
    # Up to 4 rows the block types multiply in integers: exactly x rounded to 16 bits per group of
    # 32 times the dequantized weight, up to float32 sums; the float loop where bits are 32.
    KERNELS.set_activation_bits(16)
    width = width_for(qtype)
    data = blocks(qtype, 41, width, seed=rows)  # an odd count: a tile of one weight row last
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows)) * 3
    x[0, :256] = 0.0  # a super-block of zeros: scale 0
    got = KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype))
    weight = reference(data, qtype, width)
    assert_product(got, rounded_to_16_bits(x), weight)
    unrounded = x.double().numpy() @ weight.astype(np.float64).T
    assert not np.allclose(got.double().numpy(), unrounded, rtol=1e-9, atol=0)  # it did round


def test_a_row_that_cannot_be_rounded_takes_the_float_loop(isa):
    KERNELS.set_activation_bits(16)
    data = blocks(T.Q6_K, 8, 256)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(3))
    x[0, 5] = 1e-39  # a group whose scale would be subnormal
    x[0, 40:64] = 0.0
    x[0, 32:40] = 1e-39
    got = KERNELS.ggml_gemm(x, torch.from_numpy(data), int(T.Q6_K))
    assert_product(got, x, reference(data, T.Q6_K, 256))


def rounded_to_8_bits(x: torch.Tensor) -> torch.Tensor:
    return rounded(x, 127.0, group=256)


def minimums(data: np.ndarray, qtype: T, width: int) -> np.ndarray:
    """The ``- dmin m`` part of each Q4_K/Q5_K weight: the block dequantized with every q zero."""
    zeroed = data.reshape(data.shape[0], -1, gguf.GGML_QUANT_SIZES[qtype][1]).copy()
    zeroed[..., 16:] = 0  # Q5_K's qh and qs, or Q4_K's qs
    return reference(zeroed.reshape(data.shape[0], -1), qtype, width)


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 11, 16, 33, 64, 70])
def test_k_quants_multiply_x_rounded_to_8_bits(isa, qtype, rows):
    # Under 8 bits the K-quants' products of any rows multiply x rounded to 8 bits per 256 by their
    # integers (in tiles of rows and weight rows); their
    # minimums (Q4_K, Q5_K) meet x's exact sums, Q6_K's offset of 32 the rounded ones.
    KERNELS.set_activation_bits(8)
    width = width_for(qtype)
    data = blocks(qtype, 41, width, seed=rows)  # an odd count: a tile of one weight row last
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows)) * 3
    x[0, :256] = 0.0  # a super-block of zeros: scale 0
    got = KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype))
    weight = reference(data, qtype, width)
    rounded = rounded_to_8_bits(x).double().numpy()
    if qtype == T.Q6_K:
        expected = rounded @ weight.astype(np.float64).T
    else:
        offsets = minimums(data, qtype, width).astype(np.float64)
        expected = rounded @ (weight - offsets).astype(np.float64).T + x.double().numpy() @ offsets.T
    bound = 1e-5 * np.outer(np.linalg.norm(x.double().numpy(), axis=1), np.linalg.norm(weight, axis=1))
    error = np.abs(got.double().numpy() - expected)
    assert (error <= bound).all(), f"worst error {float((error / bound).max()):.2f} of the bound"
    unrounded = x.double().numpy() @ weight.astype(np.float64).T
    assert not np.allclose(got.double().numpy(), unrounded, rtol=1e-4, atol=0)  # it did round


def test_8_bits_leave_other_types_to_the_other_products(isa):
    KERNELS.set_activation_bits(8)
    for qtype, rows in ((T.Q8_0, 1), (T.Q4_0, 2), (T.Q5_0, 5), (T.Q8_0, 33)):
        width = width_for(qtype)
        data = blocks(qtype, 16, width, seed=7)
        x = torch.randn(rows, width, generator=torch.Generator().manual_seed(8))
        got = KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype))
        expected = rounded_to_16_bits(x) if rows <= 4 else x
        assert_product(got, expected, reference(data, qtype, width))


def test_the_k_quant_switch_rounds_to_8_bits_where_bits_are_16(isa):
    data = torch.from_numpy(blocks(T.Q6_K, 16, 768, seed=9))
    x = torch.randn(2, 768, generator=torch.Generator().manual_seed(10))
    results = {}
    try:
        for bits, switch in ((8, False), (16, True), (16, False), (32, True)):
            KERNELS.set_activation_bits(bits)
            KERNELS.set_k_quant_int8(switch)
            results[bits, switch] = KERNELS.ggml_gemm(x, data, int(T.Q6_K))
    finally:
        KERNELS.set_k_quant_int8(False)
    assert torch.equal(results[8, False], results[16, True])  # the same 8-bit product
    assert not torch.equal(results[16, True], results[16, False])
    assert_product(results[32, True], x, reference(data.numpy(), T.Q6_K, 768))  # float32: unrounded


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("outputs", [64, 100], ids=["whole panels", "panels and a rest"])
@pytest.mark.parametrize("rows", [9, 32, 35])
def test_k_quant_products_of_9_rows_and_more_add_into_out(isa, qtype, rows, outputs):
    # From 9 rows, Q4_K's and Q6_K's 8-bit products on AVX-512 VNNI decode 32 weight rows at a time
    # (csrc/ggml_panels.h), on AVX2 16 from 10 rows (Q4_K) or 32 (Q6_K; ggml_panels_avx2.h): several
    # panels on several threads, with and without a rest of weight rows, a rest of rows of x past the
    # 4-row tiles, a row of zeros, and the sum into out that the decode step's o and down products take.
    KERNELS.set_activation_bits(8)
    width = 512
    data = blocks(qtype, outputs, width, seed=outputs)
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows)) * 3
    x[1] = 0.0
    x[2, 256:] = 0.0
    residual = torch.randn(rows, outputs, generator=torch.Generator().manual_seed(rows + 1))
    out = residual.clone()
    assert KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype), out=out) is out
    got = KERNELS.ggml_gemm(x, torch.from_numpy(data), int(qtype))
    weight = reference(data, qtype, width)
    x64 = x.double().numpy()
    if qtype == T.Q6_K:
        expected = rounded_to_8_bits(x).double().numpy() @ weight.astype(np.float64).T
    else:
        offsets = minimums(data, qtype, width).astype(np.float64)
        expected = rounded_to_8_bits(x).double().numpy() @ (weight - offsets).T + x64 @ offsets.T
    bound = 1e-5 * np.outer(np.linalg.norm(x64, axis=1), np.linalg.norm(weight, axis=1))
    error = np.abs(got.double().numpy() - expected)
    assert (error <= bound).all(), f"worst error {float((error / bound).max()):.2f} of the bound"
    summed = residual.double().numpy() + expected  # out's float32 sum rounds once more
    error = np.abs(out.double().numpy() - summed)
    assert (error <= bound + 1e-6 * np.abs(summed)).all(), f"worst error {float(error.max()):.3g}"
    assert not got[1].any()  # a row of zeros: exactly zero
    assert not np.allclose(got.double().numpy(), x64 @ weight.astype(np.float64).T, rtol=1e-4, atol=0)


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_a_layers_parts_in_one_call_are_its_products_part_by_part(isa, rows):
    # A Q4_K_M file's q/k/v (Q4_K, Q4_K, Q6_K) or gate/up: one parallel region over every part's
    # weight rows, x rounded once, each part's output in its own columns of every row, to the bit
    # the separate products; at the panels' row counts, or where x is not rounded to 8 bits, the
    # caller multiplies part by part.
    KERNELS.set_activation_bits(8)
    width = 512
    parts = [
        (torch.from_numpy(blocks(qtype, outputs, width, seed=outputs)), int(qtype))
        for qtype, outputs in ((T.Q4_K, 70), (T.Q5_K, 33), (T.Q6_K, 40))
    ]
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows))
    together = KERNELS.ggml_gemm_parts(x, parts)
    assert together is not None and together.shape == (rows, 143)
    assert torch.equal(together, torch.cat([KERNELS.ggml_gemm(x, weight, qtype) for weight, qtype in parts], dim=1))
    assert KERNELS.ggml_gemm_parts(torch.randn(32, width), parts) is None  # Q4_K's and Q6_K's panels
    KERNELS.set_activation_bits(16)
    assert KERNELS.ggml_gemm_parts(x, parts) is None
