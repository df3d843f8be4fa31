"""Fixtures the unit tests of our CPU kernels share."""

from __future__ import annotations

import pytest


def _avx512_products() -> bool:
    from inference import cpu_kernels

    return cpu_kernels.avx512_products()


# The block products' two versions: AVX2 everywhere the kernels load, AVX-512 where the CPU has it.
ISAS = [
    "avx2",
    pytest.param(
        "avx512", marks=pytest.mark.skipif(not _avx512_products(), reason="no AVX-512 (or torch below it) here")
    ),
]


@pytest.fixture
def kernel_choices():
    """The process's CPU kernels, whose choices (AVX-512 or AVX2 products, activation bits, the
    K-quants' 8-bit switch) a test may change: restored after it.  Skips where there are none."""
    from inference import cpu_kernels

    kernels = cpu_kernels.load(None)
    if kernels is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    chosen, bits, int8 = kernels.avx512, kernels.activation_bits, kernels.k_quant_int8
    yield kernels
    kernels.set_avx512(chosen)
    kernels.set_activation_bits(bits)
    kernels.set_k_quant_int8(int8)


@pytest.fixture(params=ISAS)
def isa(request, kernel_choices):
    """Runs a test with the block products' AVX2 version, then with their AVX-512 one, with float32
    activations and the K-quants' 8-bit switch off (an engine started earlier in the process sets 16
    bits and turns the switch on)."""
    kernel_choices.set_avx512(request.param == "avx512")
    kernel_choices.set_activation_bits(32)
    kernel_choices.set_k_quant_int8(False)
    return request.param
