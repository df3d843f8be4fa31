"""Q4_K interleaved by 8 rows (csrc/ggml_interleaved.h): the same weight, rearranged, whose products
round x to 8 bits at any row count, on AVX2 and AVX-512 (the ``isa`` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference import cpu_kernels
from tests.unit.test_ggml_kernels import KERNELS, T, blocks, minimums, reference, rounded_to_8_bits

pytestmark = pytest.mark.skipif(KERNELS is None, reason=f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
X8 = cpu_kernels.Q4_K_X8
WIDTH = 768  # 3 super-blocks


def expected_product(x: torch.Tensor, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8-bit products' value (x rounded per 256 times the integers, the minimums against x's
    exact sums) in float64, and the bound on its float32 error."""
    weight = reference(data, T.Q4_K, WIDTH)
    offsets = minimums(data, T.Q4_K, WIDTH).astype(np.float64)
    exact = x.double().numpy()
    expected = rounded_to_8_bits(x).double().numpy() @ (weight - offsets).T + exact @ offsets.T
    bound = 1e-5 * np.outer(np.linalg.norm(exact, axis=1), np.linalg.norm(weight, axis=1))
    return expected, bound


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 33, 70])
def test_the_interleaved_product_is_the_8_bit_product_of_the_stored_weight(isa, rows):
    data = blocks(T.Q4_K, 48, WIDTH, seed=rows)  # 6 groups: one thread's share ends mid-group
    x = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(rows)) * 3
    x[0, :256] = 0.0  # a super-block of zeros: scale 0
    interleaved = KERNELS.interleave_q4_k(torch.from_numpy(data))
    assert interleaved.shape == data.shape and not torch.equal(interleaved, torch.from_numpy(data))
    got = KERNELS.ggml_gemm(x, interleaved, X8)  # float32 activations set: this type rounds anyway
    expected, bound = expected_product(x, data)
    error = np.abs(got.double().numpy() - expected)
    assert (error <= bound).all(), f"worst error {float((error / bound).max()):.2f} of the bound"
    KERNELS.set_activation_bits(8)  # the stored blocks' 8-bit products
    stored = KERNELS.ggml_gemm(x, torch.from_numpy(data), int(T.Q4_K))
    assert (np.abs(got.double().numpy() - stored.double().numpy()) <= 2 * bound).all()


def test_the_interleaved_product_adds_into_out(isa):
    data = torch.from_numpy(blocks(T.Q4_K, 16, WIDTH))
    interleaved = KERNELS.interleave_q4_k(data)
    x = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(1))
    out = torch.ones(3, 16)
    KERNELS.ggml_gemm(x, interleaved, X8, out=out)
    torch.testing.assert_close(out, KERNELS.ggml_gemm(x, interleaved, X8) + 1, rtol=1e-6, atol=1e-6)


def test_a_row_that_cannot_be_rounded_is_multiplied_in_float32(isa):
    data = blocks(T.Q4_K, 8, WIDTH)
    x = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(2))
    x[1, 5] = float("inf")
    got = KERNELS.ggml_gemm(x, KERNELS.interleave_q4_k(torch.from_numpy(data)), X8)
    weight = reference(data, T.Q4_K, WIDTH).astype(np.float64)
    expected = x[:1].double().numpy() @ weight.T  # the whole call is in float32: no rounding
    bound = 1e-5 * np.linalg.norm(x[0].double().numpy()) * np.linalg.norm(weight, axis=1)
    assert (np.abs(got[0].double().numpy() - expected[0]) <= bound).all()
    assert not torch.isfinite(got[1]).any()


def test_interleaved_rows_read_back_as_the_stored_ones(isa):
    data = blocks(T.Q4_K, 24, WIDTH, seed=3)
    interleaved = KERNELS.interleave_q4_k(torch.from_numpy(data))
    rows = torch.tensor([0, 7, 8, 23, 5])
    got = KERNELS.ggml_dequantize_rows(interleaved, X8, WIDTH, rows)
    np.testing.assert_array_equal(got.numpy(), reference(data, T.Q4_K, WIDTH)[rows.numpy()])
    copy = KERNELS.ggml_to_bfloat16(interleaved, X8, WIDTH)
    assert torch.equal(copy, KERNELS.ggml_to_bfloat16(torch.from_numpy(data), int(T.Q4_K), WIDTH))


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_interleaved_parts_in_one_call_are_their_products_part_by_part(isa, rows):
    KERNELS.set_activation_bits(8)
    parts = [
        (KERNELS.interleave_q4_k(torch.from_numpy(blocks(T.Q4_K, 64, 512, seed=1))), X8),
        (torch.from_numpy(blocks(T.Q6_K, 40, 512, seed=2)), int(T.Q6_K)),
        (KERNELS.interleave_q4_k(torch.from_numpy(blocks(T.Q4_K, 24, 512, seed=3))), X8),
    ]
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    together = KERNELS.ggml_gemm_parts(x, parts)
    assert together is not None and together.shape == (rows, 128)
    assert torch.equal(together, torch.cat([KERNELS.ggml_gemm(x, weight, kind) for weight, kind in parts], dim=1))


def test_interleaving_takes_whole_groups_of_8_rows():
    with pytest.raises(ValueError):
        KERNELS.interleave_q4_k(torch.from_numpy(blocks(T.Q4_K, 12, WIDTH)))
    with pytest.raises(ValueError):
        KERNELS.interleave_q4_k(torch.zeros(8, 100, dtype=torch.uint8))
