"""Our CPU kernels (inference/cpu_kernels.py) compute what torch computes, in float32.

The block-quantized products are compared with torch's float32 product of the dequantized weight at
every row count the kernel's row blocks distinguish (1 to 8 rows, and past 8); the decode operations
with the torch operations they replace.  The Llama runner's use of them (its fused decode step) is
tested against transformers in test_llama_runner.py.  Skipped where the kernels cannot run (no AVX2
or no C++ compiler); :func:`test_the_kernels_load_where_the_machine_can_build_them` says which.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from inference import cpu_kernels
from inference.weights import (
    Q4_1Blocks,
    Q4_1Linear,
    Q8_0Linear,
    is_lossless_q8_0,
    make_linear,
    quantize_q8_0,
)

KERNELS = cpu_kernels.load(None)
needs_kernels = pytest.mark.skipif(KERNELS is None, reason=f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
ROWS = [1, 2, 3, 5, 8, 11, 33, 70]


@contextlib.contextmanager
def code_with(bits: int, *, avx512: bool = False, vnni: bool = False):
    """The block products on their AVX2 code (or AVX-512, with VNNI or without) with ``bits``-bit
    activations; every choice restored after."""
    chosen, before, had_vnni = KERNELS.avx512, KERNELS.activation_bits, KERNELS.vnni
    try:
        KERNELS.set_avx512(avx512)
        KERNELS.set_vnni(vnni)
        KERNELS.set_activation_bits(bits)
        yield
    finally:
        KERNELS.set_activation_bits(before)
        KERNELS.set_vnni(had_vnni)
        KERNELS.set_avx512(chosen)


VNNI = KERNELS is not None and KERNELS.vnni  # the CPU has AVX-512 VNNI (on at load where it has)
# The AVX-512 rounded products: with VNNI's dpwssd, and with madd and add.
WIDE_ROUNDING = [
    pytest.param(True, marks=pytest.mark.skipif(not VNNI, reason="no AVX-512 VNNI here")),
    pytest.param(
        False, marks=pytest.mark.skipif(not cpu_kernels.avx512_products(), reason="no AVX-512 (or torch below it) here")
    ),
]


def random_q4_1(out: int, inp: int, generator: torch.Generator) -> Q4_1Blocks:
    q = torch.randint(0, 16, (out, inp), dtype=torch.uint8, generator=generator)
    d = (torch.rand(out, inp // 32, generator=generator) * 0.01).half()
    m = (-torch.rand(out, inp // 32, generator=generator) * 0.08).half()
    return Q4_1Blocks(q, d, m)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).abs().max() / expected.abs().max()).item()


def test_the_kernels_load_where_the_machine_can_build_them():
    if cpu_kernels.unavailable_reason() is None and cpu_kernels._compiler() is not None:
        assert KERNELS is not None
    else:
        assert KERNELS is None


@needs_kernels
def test_configure_sets_the_loaded_kernels_and_those_a_later_load_returns(monkeypatch):
    # The engine configures before its model loads, so that the load's timings run its products.
    assert KERNELS is not None
    saved = (KERNELS.activation_bits, KERNELS.k_quant_int8)
    monkeypatch.setattr(cpu_kernels, "_settings", None)
    with pytest.raises(ValueError, match="activation bits"):
        cpu_kernels.configure(12, k_quant_int8=True)  # refused before any load could meet it
    assert cpu_kernels._settings is None
    try:
        cpu_kernels.configure(8, k_quant_int8=True)
        assert (KERNELS.activation_bits, KERNELS.k_quant_int8) == (8, KERNELS.k_quant_int8_available)
        KERNELS.set_activation_bits(16)  # the shared library's state at a fresh process's load
        KERNELS.set_k_quant_int8(False)
        monkeypatch.setattr(cpu_kernels, "_loaded", {})  # a load of the same build, as a fresh process's
        cpu_kernels.configure(32, k_quant_int8=False)
        again = cpu_kernels.load(KERNELS.path.parent.parent)
        assert again is not None and again is not KERNELS
        assert (again.activation_bits, again.k_quant_int8) == (32, False)
    finally:
        KERNELS.set_activation_bits(saved[0])
        KERNELS.set_k_quant_int8(saved[1])


@needs_kernels
@pytest.mark.parametrize("rows", ROWS)
def test_q4_1_product_is_the_float32_product_of_the_blocks_as_they_are(rows, isa):
    generator = torch.Generator().manual_seed(rows)
    blocks = random_q4_1(46, 96, generator)  # 46: output features past whole blocks of 6 (AVX2) and 8 (AVX-512)
    layer = Q4_1Linear(blocks)
    x = torch.randn(rows, 96, generator=generator)
    with torch.inference_mode():
        expected = x @ blocks.dequantize().T
        assert torch.equal(layer.dequantized(), blocks.dequantize())  # no rounding of d or m
        assert relative_error(layer(x), expected) < 1e-6
        residual = torch.randn(rows, 46, generator=generator)
        added = residual + expected
        layer.add_into(x, residual)
        assert relative_error(residual, added) < 1e-6


@needs_kernels
@pytest.mark.parametrize("rows", ROWS)
def test_q8_0_gives_q8_0_weights_back_and_computes_their_float32_product(rows, isa):
    generator = torch.Generator().manual_seed(rows)
    q = torch.randint(-127, 128, (24, 64), dtype=torch.int8, generator=generator)
    q[:, 0] = 127  # each group has its largest value, as ggml's quantizer makes them
    q[:, 32] = -127
    d = (torch.rand(24, 2, generator=generator) * 0.01).half().float()
    weight = (q.float().reshape(24, 2, 32) * d[..., None]).reshape(24, 64)
    assert is_lossless_q8_0(weight)
    assert not is_lossless_q8_0(torch.randn(24, 64, generator=generator))
    requantized, scales = quantize_q8_0(weight)
    assert torch.equal(requantized, q)
    torch.testing.assert_close(scales, d, rtol=2**-23, atol=0)
    x = torch.randn(rows, 64, generator=generator)
    with torch.inference_mode():
        layer = Q8_0Linear(weight, torch.randn(24, generator=generator))
        assert relative_error(layer(x), F.linear(x, weight, layer.bias)) < 1e-6
        # bfloat16 activations come back in bfloat16, computed in float32.
        assert layer(x.bfloat16()).dtype == torch.bfloat16


@needs_kernels
def test_a_plan_mixing_our_formats_with_torchs_adds_into_the_residual_by_row_count():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(32, 64, generator=generator)
    from inference.weights import Plan

    layer = make_linear(weight, None, Plan(((2, "q8_0"), (None, "float32"))))
    for rows in (1, 2, 3, 9):
        x = torch.randn(rows, 64, generator=generator)
        residual = torch.zeros(rows, 32)
        layer.add_into(x, residual)
        assert relative_error(residual, x @ weight.T) < (1e-2 if rows <= 2 else 1e-6)


@needs_kernels
def test_a_wrong_input_width_is_an_error_not_a_read_past_the_weight():
    generator = torch.Generator().manual_seed(0)
    for layer in (Q8_0Linear(torch.randn(8, 64, generator=generator)), Q4_1Linear(random_q4_1(8, 64, generator))):
        with pytest.raises(RuntimeError, match="width 4096"):
            layer(torch.randn(1, 4096))
        with pytest.raises(RuntimeError, match="width 96"):
            layer.add_into(torch.randn(2, 96), torch.zeros(2, 8))


@needs_kernels
def test_a_nan_score_stays_nan_in_attention():
    heads, kv_heads, dim, capacity = 2, 1, 8, 16
    qkv = torch.ones(1, (heads + 2 * kv_heads) * dim)
    keys, values = torch.zeros(1, kv_heads, capacity, dim), torch.ones(1, kv_heads, capacity, dim)
    keys[0, 0, 0, 0] = float("nan")
    cos, sin = torch.ones(capacity, dim), torch.zeros(capacity, dim)
    got = KERNELS.decode_attention(qkv, heads, kv_heads, cos, sin, torch.tensor([9]), keys, values)
    assert got.isnan().all()  # as torch's attention: a NaN key poisons the row


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3])
def test_rms_norm_and_silu_mul_are_torchs(rows):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 100, generator=generator) * 3
    weight = torch.randn(100, generator=generator)
    torch.testing.assert_close(KERNELS.rms_norm(x, weight, 1e-5), F.rms_norm(x, (100,), weight, 1e-5))
    gate_up = torch.randn(rows, 2 * 44, generator=generator) * 4
    gate, up = gate_up.split(44, dim=-1)
    torch.testing.assert_close(KERNELS.silu_mul(gate_up), F.silu(gate) * up)
    torch.testing.assert_close(KERNELS.gelu_mul(gate_up), F.gelu(gate, approximate="tanh") * up)


@needs_kernels
@pytest.mark.parametrize("rows", [2, 300])  # 300 x 300 runs on the pool's threads
def test_silu_and_gelu_mul_of_bfloat16_round_as_torchs_cast(rows):
    """On bfloat16 gate/up (a long prefill chunk's bfloat16 product), each GLU computes in float32
    and rounds its result to bfloat16 exactly as torch's cast does: what the down product got before
    from the float32 GLU; NaN and infinities kept."""
    generator = torch.Generator().manual_seed(2)
    width = 300 + 3  # a tail past the 8-wide vectors
    gate_up = (torch.randn(rows, 2 * width, generator=generator) * 4).to(torch.bfloat16)
    gate_up[0, 0], gate_up[0, width + 1], gate_up[-1, 5] = float("nan"), float("inf"), -1e30
    for name in ("silu_mul", "gelu_mul"):
        wide = getattr(KERNELS, name)(gate_up.float())
        got = getattr(KERNELS, name)(gate_up)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, width)
        expected = wide.to(torch.bfloat16)
        assert torch.equal(got.isnan(), expected.isnan()), name  # NaN payloads differ by CPU; NaN stays
        assert torch.equal(got.nan_to_num(0.0).view(torch.int16), expected.nan_to_num(0.0).view(torch.int16)), name


@needs_kernels
def test_glu_of_many_rows_equals_its_rows_alone():
    generator = torch.Generator().manual_seed(3)
    gate_up = torch.randn(257, 2 * 512, generator=generator)
    whole = KERNELS.silu_mul(gate_up)
    assert torch.equal(whole[100:101], KERNELS.silu_mul(gate_up[100:101].contiguous()))
    with pytest.raises(ValueError, match="contiguous"):
        KERNELS.silu_mul(gate_up.t())


@needs_kernels
@pytest.mark.parametrize("rows", [1, 37])  # 37 rows of a vocabulary past a whole vector: the pool's threads and a tail
def test_prompt_logprobs_are_log_softmax_then_top_1(rows):
    """A prompt's log-probabilities (echo): each row's target and its most likely token as
    ``log_softmax`` then ``topk(1)`` give them, the first id of a tie, NaN for a row holding a NaN
    (its index the top id) and for a target outside the vocabulary."""
    generator = torch.Generator().manual_seed(4)
    vocab = 1000 + 5
    logits = torch.randn(rows, vocab, generator=generator) * 6
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    logits[0, 17] = logits[0, 900] = logits[0].max() + 1  # a tie: the first id wins
    got, top_ids, top_values = KERNELS.prompt_logprobs(logits, targets)
    expected = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(got, expected.gather(-1, targets[:, None])[:, 0], rtol=1e-6, atol=2e-6)
    values, ids = expected.topk(1, dim=-1)
    torch.testing.assert_close(top_values, values[:, 0], rtol=1e-6, atol=2e-6)
    assert top_ids[0] == 17 and torch.equal(top_ids[1:], ids[1:, 0])

    logits[-1, 1003] = float("nan")
    got, top_ids, top_values = KERNELS.prompt_logprobs(logits, torch.tensor([vocab] + [0] * (rows - 1)))
    assert got[0].isnan() and got[-1].isnan() and top_values[-1].isnan() and top_ids[-1] == 1003


@needs_kernels
def test_prompt_logprobs_take_only_contiguous_float32_rows_on_the_cpu():
    """The kernel reads logits and targets through raw pointers: strided, float64 or off-CPU logits
    (a GPU's: meta here, whose pointer is null), or too few targets, raise instead of being read
    out of bounds."""
    logits, targets = torch.randn(9, 4), torch.zeros(4, dtype=torch.long)
    for bad in (logits.t(), logits.t().double(), torch.zeros(4, 9, device="meta")):
        with pytest.raises(ValueError, match="prompt_logprobs takes"):
            KERNELS.prompt_logprobs(bad, targets)
    with pytest.raises(ValueError, match="one target a row"):
        KERNELS.prompt_logprobs(torch.randn(4, 9), targets[:3])


@needs_kernels
def test_decode_attention_soft_caps_scores_as_gemma_2_does():
    """Scores scaled, then ``cap * tanh(score / cap)`` before the softmax (inference.llama's
    soft_capped_attention, transformers' Gemma 2), at a cap the scores reach."""
    from inference.llama import soft_capped_attention

    generator = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, capacity, position, scale, cap = 4, 2, 16, 24, 20, 0.4, 5.0
    qkv = torch.randn(1, (heads + 2 * kv_heads) * dim, generator=generator) * 3
    cos, sin = torch.ones(capacity, dim), torch.zeros(capacity, dim)  # no rotation
    keys = torch.randn(1, kv_heads, capacity, dim, generator=generator) * 3
    values = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    got = KERNELS.decode_attention(
        qkv, heads, kv_heads, cos, sin, torch.tensor([position]), keys, values, softcap=cap, scale=scale
    )
    queries = qkv[:, : heads * dim].view(1, kv_heads, heads // kv_heads, dim) * (scale * dim**0.5)
    expected = soft_capped_attention(queries, keys[:, :, : position + 1], values[:, :, : position + 1], None, cap)
    torch.testing.assert_close(got, expected.reshape(1, heads * dim), rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize(
    ("cache_dtype", "dim"),
    [
        (torch.float32, 16),
        (torch.float16, 16),
        (torch.float16, 64),
        (torch.float16, 96),
        (torch.float32, 160),
        (torch.float16, 256),
    ],
)
def test_decode_attention_rotates_writes_the_cache_and_attends_over_each_rows_own_length(cache_dtype, dim):
    """float32 caches exactly; float16 ones hold the new key and value rounded as torch's cast rounds,
    and attention reads them back in float32 (dims 64 and 96: the unrolled weighted sum; 160 in parts
    of 32, 256 in parts of 128)."""
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, rows, capacity = 6, 2, 3, 40
    positions = torch.tensor([0, 17, 39])
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=generator)
    angles = torch.randn(capacity, dim // 2, generator=generator)
    cos = torch.cat([angles.cos(), angles.cos()], -1)
    sin = torch.cat([-angles.sin(), angles.sin()], -1)  # the runner's table: first half negated
    keys = torch.randn(rows + 1, kv_heads, capacity, dim, generator=generator).to(cache_dtype)
    values = torch.randn(rows + 1, kv_heads, capacity, dim, generator=generator).to(cache_dtype)
    expected_keys, expected_values = keys.clone(), values.clone()

    got = KERNELS.decode_attention(qkv, heads, kv_heads, cos, sin, positions, keys, values)

    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    half = dim // 2

    def rope(x, position):  # transformers' x * cos + rotate_half(x) * sin
        sine = torch.cat([angles[position].sin()] * 2)
        return x * cos[position] + torch.cat([-x[..., half:], x[..., :half]], -1) * sine

    for row, position in enumerate(positions.tolist()):
        expected_keys[row, :, position] = rope(k[row].view(kv_heads, dim), position).to(cache_dtype)
        expected_values[row, :, position] = v[row].view(kv_heads, dim).to(cache_dtype)
        query = rope(q[row].view(heads, dim), position).view(kv_heads, heads // kv_heads, dim)
        attended = F.scaled_dot_product_attention(
            query, expected_keys[row, :, : position + 1].float(), expected_values[row, :, : position + 1].float()
        )
        torch.testing.assert_close(got[row], attended.reshape(heads * dim), rtol=1e-5, atol=1e-5)
    # The new keys agree to float32's last bits (the kernel's rotation may round differently), which
    # float16 rounds the same way but for a rare tie; every other column is untouched.
    torch.testing.assert_close(
        keys.float(), expected_keys.float(), rtol=1e-6 if cache_dtype == torch.float32 else 1e-3, atol=1e-6
    )
    assert torch.equal(values, expected_values)  # the row past the batch and every other column untouched


@needs_kernels
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 128), (8, 1, 64), (4, 2, 96), (2, 1, 256)])
def test_prefill_attention_writes_each_sequences_cache_and_attends_causally_as_sdpa_does(
    cache_dtype, heads, kv_heads, dim
):
    """Several sequences in one pass (new ones, one continuing 300 cached positions, one of a single
    row, row counts no block divides, some (at 301, 31, 30) whose tiles of queries straddle a block of
    keys, the last of them with padding),
    against float64 SDPA with a causal mask over the caches the kernel wrote: the keys rotated as
    transformers rotates them, the values as given, and every position outside the new rows untouched."""
    generator = torch.Generator().manual_seed(0)
    sequences = [(37, 0), (3, 11), (1, 0), (70, 300), (16, 0), (40, 301), (2, 31), (3, 30)]  # (rows, cached)
    tokens, width = sum(rows for rows, _ in sequences), (heads + 2 * kv_heads) * dim
    qkv = torch.randn(tokens, width, generator=generator)
    angles = torch.rand(400, dim // 2, generator=generator) * 6
    cos = torch.cat([angles.cos(), angles.cos()], -1)
    sin = torch.cat([-angles.sin(), angles.sin()], -1)  # the runner's table: first half negated
    caches = [
        tuple(torch.randn(kv_heads, start + rows + 5, dim, generator=generator).to(cache_dtype) for _ in range(2))
        for rows, start in sequences
    ]
    before = [(keys.clone(), values.clone()) for keys, values in caches]
    table, row0 = [], 0
    for (rows, start), (keys, values) in zip(sequences, caches):
        table.append([row0, rows, start, keys.stride(0), keys.data_ptr(), values.data_ptr()])
        row0 += rows
    given, out = qkv.clone(), torch.empty(tokens, heads * dim)

    assert KERNELS.prefill_attention(qkv, torch.tensor(table), heads, kv_heads, cos, sin, cache_dtype, out)

    half, row0 = dim // 2, 0
    for (rows, start), (keys, values), (old_keys, old_values) in zip(sequences, caches, before):
        x = given[row0 : row0 + rows].double()
        positions = torch.arange(start, start + rows)
        c, s = cos[positions].double()[:, None], sin[positions].double()[:, None]

        def rope(t, c=c, s=s):
            return t * c + torch.cat([t[..., half:], t[..., :half]], -1) * s

        q = rope(x[:, : heads * dim].view(rows, heads, dim))
        new_keys = rope(x[:, heads * dim : (heads + kv_heads) * dim].view(rows, kv_heads, dim)).transpose(0, 1)
        new_values = x[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim).transpose(0, 1)
        tolerance = 1e-3 if cache_dtype == torch.float16 else 1e-6  # the kernel's rotation may round differently
        torch.testing.assert_close(keys[:, start : start + rows].double(), new_keys, rtol=tolerance, atol=tolerance)
        assert torch.equal(values[:, start : start + rows], new_values.to(cache_dtype))
        for cache, old in ((keys, old_keys), (values, old_values)):  # the other positions untouched
            assert torch.equal(cache[:, :start], old[:, :start]) and torch.equal(
                cache[:, start + rows :], old[:, start + rows :]
            )
        end = start + rows
        causal = torch.arange(end)[None, :] <= positions[:, None]
        expected = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None, :, :end].double(), values[None, :, :end].double(),
            attn_mask=causal, enable_gqa=True,
        )[0].transpose(0, 1).reshape(rows, heads * dim)  # fmt: skip
        torch.testing.assert_close(out[row0 : row0 + rows].double(), expected, rtol=1e-5, atol=1e-5)
        row0 += rows


@needs_kernels
def test_prefill_attention_declines_head_sizes_it_has_no_code_for():
    qkv, out = torch.randn(4, 3 * 32), torch.empty(4, 32)
    keys = values = torch.zeros(1, 8, 32)
    table = torch.tensor([[0, 4, 0, keys.stride(0), keys.data_ptr(), values.data_ptr()]])
    cos = sin = torch.zeros(8, 32)
    assert not KERNELS.prefill_attention(qkv, table, 1, 1, cos, sin, torch.float32, out)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("every_other_position", [False, True])
def test_copy_cache_rows_puts_a_prefilled_cache_into_batch_rows_as_torch_does(dtype, every_other_position):
    generator = torch.Generator().manual_seed(0)
    layers, kv_heads, dim, capacity, length = 3, 2, 8, 16, 5
    # The running batch's buffers: 4 rows, the first of which runs already (it must stay as it is).
    keys = [torch.randn(4, kv_heads, capacity, dim, generator=generator).to(dtype) for _ in range(layers)]
    values = [torch.randn(4, kv_heads, capacity, dim, generator=generator).to(dtype) for _ in range(layers)]
    expected_keys, expected_values = [k.clone() for k in keys], [v.clone() for v in values]
    source = torch.randn(2, layers, kv_heads, 2 * length, dim, generator=generator).to(dtype)
    if every_other_position:  # a cache whose positions are not adjacent: copied position by position
        source_keys, source_values = source[0, :, :, ::2], source[1, :, :, ::2]
    else:
        source_keys, source_values = source[0, :, :, :length], source[1, :, :, :length]
    for layer in range(layers):
        expected_keys[layer][1:3, :, :length] = source_keys[layer, None, :, :length]
        expected_values[layer][1:3, :, :length] = source_values[layer, None, :, :length]
    targets = torch.tensor([t.data_ptr() for t in (*keys, *values)], dtype=torch.int64)
    assert KERNELS.copy_cache_rows(targets, capacity, 1, 2, source_keys, source_values, length)
    for got, expected in zip((*keys, *values), (*expected_keys, *expected_values)):
        assert torch.equal(got, expected)
    # Layouts it does not take are refused, nothing copied: the caller copies with torch instead.
    assert not KERNELS.copy_cache_rows(
        targets, capacity, 1, 2, source_keys.bfloat16(), source_values.bfloat16(), length
    )
    assert not KERNELS.copy_cache_rows(targets[:2], capacity, 1, 2, source_keys, source_values, length)


@needs_kernels
@pytest.mark.parametrize("bits", [32, 16])
@pytest.mark.parametrize("rows", [1, 13])
def test_q4_1_keeps_its_precision_when_the_activations_have_a_mean(isa, bits, rows):
    # Symmetric groups (m = -7.5 d, as Q4_1 makes of zero-centred weights) and x with a mean of 100:
    # the rounded products' group sums must not cancel (uncentred nibbles lost two digits at one
    # row), in float32 nor with 16-bit activations (the AVX2 default; the AVX-512 products never round).
    KERNELS.set_activation_bits(bits)
    generator = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (64, 1024), dtype=torch.uint8, generator=generator)
    d = (torch.rand(64, 32, generator=generator) * 0.01 + 0.001).half()
    blocks = Q4_1Blocks(q, d, (-7.5 * d.float()).half())
    layer = Q4_1Linear(blocks)
    x = torch.randn(rows, 1024, generator=generator) + 100
    expected = x.double() @ blocks.dequantize().double().T
    with torch.inference_mode():
        assert relative_error(layer(x).double(), expected) < {32: 3e-6, 16: 3e-5}[bits]


def rounded_product(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, minimums: torch.Tensor | None, bits: int):
    """The AVX2 products with rounded activations, in float64 from the rounding: x ``[rows, K]``
    rounded per group of 32 (scale max|x| / (2^(bits-1) - 1), in float32 as the kernel does it, to
    nearest), the integer dot product with q ``[N, K]`` per group, times d * dx, plus ``minimums``
    ``[N, K / 32]`` (Q4_1's m + 8 d) times the group's float sum of x."""
    rows, width = x.shape
    groups = x.view(rows, width // 32, 32)
    scale = groups.abs().amax(dim=-1) / (2 ** (bits - 1) - 1)
    inverse = torch.where(scale > 0, 1 / torch.where(scale > 0, scale, 1), 0)
    rounded = torch.round(groups * inverse[..., None]).double()  # to nearest, ties to even
    q = q.double().view(q.shape[0], width // 32, 32)
    sums = torch.einsum("rgk,ngk->rng", rounded, q)  # exact: integers below 2^53
    expected = (sums * d.double()[None] * scale.double()[:, None]).sum(-1)
    if minimums is not None:
        expected += groups.double().sum(-1) @ minimums.double().T
    return expected


@needs_kernels
@pytest.mark.parametrize("rows,bits", [(1, 16), (1, 8), (5, 16), (8, 16), (13, 16), (13, 8), (70, 16)])
def test_q4_1_with_rounded_activations_is_the_integer_product_of_the_rounding(rows, bits):
    # The AVX2 product with set_activation_bits(16) (the engine's default) or (8)
    # (ENGINE_Q8_ACTIVATIONS=on: the one-row product as llama.cpp's q4_1 x q8_1; from 5 rows on, 16
    # bits either way): x rounded per group of 32, the centred nibbles' integer dot product, then
    # d * dx and (m + 8 d) * sum(x).  46 output features: past whole tiles of 6; 13 rows: a tile of
    # 8 and a rest.
    generator = torch.Generator().manual_seed(5 + rows)
    blocks = random_q4_1(46, 96, generator)
    layer = Q4_1Linear(blocks)
    x = torch.randn(rows, 96, generator=generator) * 3
    x[0, 40] = 0.0
    x[0, 64:] = 0.0  # an all-zero group: scale 0, no division by it
    assert bits in KERNELS.activation_bits_available  # its load-time self-check passed
    with code_with(bits), torch.inference_mode():
        got = layer(x).double()
        residual = torch.randn(rows, 46, generator=generator)
        added = residual.double() + got
        layer.add_into(x, residual)
    width = bits if rows == 1 else 16
    d, m = blocks.d.float(), blocks.m.float()
    expected = rounded_product(x, blocks.q.int() - 8, d, m + 8 * d, width)
    assert relative_error(got, expected) < 1e-6
    assert relative_error(residual.double(), added) < 1e-6
    # ... and within the rounding's reach of the float32 product (and past the float32 loop's own error).
    exact = x.double() @ blocks.dequantize().double().T
    assert {16: 1e-6, 8: 1e-4}[width] < relative_error(got, exact) < {16: 1e-4, 8: 3e-2}[width]


@needs_kernels
@pytest.mark.parametrize(("rows", "bits"), [(1, 16), (1, 8), (5, 16), (13, 16), (70, 16)])
def test_q8_0_at_one_row_and_from_5_rows_with_16_bit_activations_is_the_integer_product_of_the_rounding(rows, bits):
    # bits 8 rounds the one-row Q4_1 product alone (ENGINE_Q8_ACTIVATIONS): Q8_0's stays at 16.
    generator = torch.Generator().manual_seed(20 + rows)
    q = torch.randint(-127, 128, (46, 96), dtype=torch.int8, generator=generator)
    d = (torch.rand(46, 3, generator=generator) * 0.01).half().float()
    layer = Q8_0Linear((q.float().view(46, 3, 32) * d[..., None]).view(46, 96))
    x = torch.randn(rows, 96, generator=generator) * 3
    with code_with(bits), torch.inference_mode():
        got = layer(x).double()
    assert relative_error(got, rounded_product(x, layer.q, layer.d, None, 16)) < 1e-6  # its own blocks
    exact = x.double() @ layer.dequantized().double().T
    assert 1e-6 < relative_error(got, exact) < 1e-4


@needs_kernels
@pytest.mark.parametrize("vnni", WIDE_ROUNDING)
@pytest.mark.parametrize("rows", [6, 7, 8, 9, 13, 70])
def test_avx512_products_from_7_rows_are_the_integer_products_of_16_bit_activations(rows, vnni):
    # As on the AVX2 code: at 7 and 8 rows in tiles of 8 rows, from 9 rows on in tiles of 16, both
    # against 12 output rows (46: past whole ones); below 7 rows (and at one) the float32 loop.
    generator = torch.Generator().manual_seed(40 + rows)
    blocks = random_q4_1(46, 96, generator)
    q = torch.randint(-127, 128, (46, 96), dtype=torch.int8, generator=generator)
    scales = (torch.rand(46, 3, generator=generator) * 0.01).half().float()
    q8 = Q8_0Linear((q.float().view(46, 3, 32) * scales[..., None]).view(46, 96))
    x = torch.randn(rows, 96, generator=generator) * 3
    with code_with(16, avx512=True, vnni=vnni), torch.inference_mode():
        got, got8 = Q4_1Linear(blocks)(x).double(), q8(x).double()
        residual = torch.randn(rows, 46, generator=generator)
        added = residual.double() + got
        Q4_1Linear(blocks).add_into(x, residual)
    exact, exact8 = x.double() @ blocks.dequantize().double().T, x.double() @ q8.dequantized().double().T
    if rows < 7:
        assert relative_error(got, exact) < 1e-6 and relative_error(got8, exact8) < 1e-6
        return
    d, m = blocks.d.float(), blocks.m.float()
    assert relative_error(got, rounded_product(x, blocks.q.int() - 8, d, m + 8 * d, 16)) < 1e-6
    assert relative_error(got8, rounded_product(x, q8.q, q8.d, None, 16)) < 1e-6
    assert relative_error(residual.double(), added) < 1e-6
    assert 1e-6 < relative_error(got, exact) < 1e-4


@needs_kernels
@pytest.mark.parametrize("rows", [2, 4])
def test_products_of_2_to_4_rows_keep_float32_activations(rows):
    # Below ROUNDED_ROWS the float32 loop, also under the 16-bit setting.
    generator = torch.Generator().manual_seed(30 + rows)
    blocks = random_q4_1(46, 96, generator)
    x = torch.randn(rows, 96, generator=generator)
    with code_with(16), torch.inference_mode():
        got = Q4_1Linear(blocks)(x).double()
    assert relative_error(got, x.double() @ blocks.dequantize().double().T) < 1e-6


@needs_kernels
def test_set_activation_bits_takes_32_16_or_8_only():
    with pytest.raises(ValueError):
        KERNELS.set_activation_bits(4)
    with pytest.raises(TypeError):
        KERNELS.set_activation_bits(16.0)  # type: ignore[arg-type]
    assert 16 in KERNELS.activation_bits_available


@needs_kernels
@pytest.mark.parametrize(("q8", "bits"), [(False, 16), (True, 8)])
def test_the_engine_sets_the_activation_bits_from_the_q8_setting(settings, q8, bits):
    from api.engine import engine_configs
    from testing.tiny_engine import start_tiny_engine

    settings.ENGINE_Q8_ACTIVATIONS = q8
    before, engine = KERNELS.activation_bits, None
    try:
        KERNELS.set_activation_bits(32)
        engine = start_tiny_engine(activation_bits=engine_configs()[1].activation_bits)
        assert KERNELS.activation_bits == bits
    finally:
        if engine is not None:
            engine.stop()
        KERNELS.set_activation_bits(before)


needs_avx512 = pytest.mark.skipif(
    KERNELS is None or not cpu_kernels.avx512_products(), reason="no AVX-512 products (or torch below it) here"
)


@needs_avx512
def test_q4_1_to_bfloat16_is_torchs_cast_of_the_blocks():
    blocks = random_q4_1(46, 96, torch.Generator().manual_seed(8))
    layer = Q4_1Linear(blocks)
    assert torch.equal(KERNELS.q4_1_to_bfloat16(layer.qs, layer.d, layer.m), blocks.dequantize().bfloat16())


@needs_avx512
def test_a_q4_1_layer_runs_long_prefill_chunks_in_bfloat16_from_its_blocks():
    generator = torch.Generator().manual_seed(9)
    blocks = random_q4_1(46, 96, generator)
    layer = Q4_1Linear(blocks)
    layer.bfloat16_rows = 12
    weight = blocks.dequantize()
    with torch.inference_mode():
        short, long = torch.randn(6, 96, generator=generator), torch.randn(12, 96, generator=generator)
        assert relative_error(layer(short), short @ weight.T) < 1e-6  # our kernel, float32 below 7 rows
        in_bfloat16 = F.linear(long.bfloat16(), weight.bfloat16()).float()
        assert torch.equal(layer(long), in_bfloat16)
        residual = torch.randn(12, 46, generator=generator)
        expected = residual + in_bfloat16
        layer.add_into(long, residual)
        assert torch.equal(residual, expected)
    assert layer.step_parts(11) is not None and layer.step_parts(12) is None  # the whole-step kernel is float32


@needs_kernels
def test_q4_1_layers_take_bfloat16_prefill_only_where_the_autotune_timed_it_faster():
    from inference.weights import BFLOAT16_PREFILL_ROWS, Choice, Plan, bfloat16_prefill_available

    blocks = random_q4_1(46, 96, torch.Generator().manual_seed(10))
    weight = blocks.dequantize()
    plans = (Plan.single("q4_1"), Plan.single("q4_1"))
    faster = Choice(*plans, "autotune", bfloat16_prefill=True).make_layer(weight, q4_1=blocks)
    slower = Choice(*plans, "autotune", bfloat16_prefill=False).make_layer(weight, q4_1=blocks)
    requested = Choice(*plans, "requested").make_layer(weight, q4_1=blocks)
    assert faster.bfloat16_rows == (BFLOAT16_PREFILL_ROWS if bfloat16_prefill_available() else None)
    assert slower.bfloat16_rows is None and requested.bfloat16_rows is None


@needs_kernels
@pytest.mark.parametrize("bfloat16_ms", [10.0, 30.0], ids=["bfloat16 faster", "bfloat16 slower"])
def test_the_autotune_times_the_bfloat16_prefill_and_caches_its_decision(tmp_path, monkeypatch, bfloat16_ms):
    from inference import weights

    monkeypatch.setattr(weights, "bfloat16_prefill_available", lambda: True)
    monkeypatch.setattr(weights, "_others_share", lambda *a: 0.0)  # timed on a quiet machine: cached
    monkeypatch.setattr(weights, "_time_bfloat16_prefill", lambda *a: {"q4_1": 20.0, "bfloat16": bfloat16_ms})
    tiny = dict(layer_shapes=[(64, 64)], layers=2, output_shape=(96, 64), candidates=("q4_1",), repeats=1)
    first = weights.choose_formats(cache_dir=tmp_path, **tiny)
    assert first.source == "autotune" and first.bfloat16_prefill == (bfloat16_ms < 18.0)
    assert first.timings["prefill"] == {"q4_1": {"256": 20.0}, "bfloat16": {"256": bfloat16_ms}}
    monkeypatch.setattr(weights, "_time_bfloat16_prefill", lambda *a: pytest.fail("timed again despite the cache"))
    second = weights.choose_formats(cache_dir=tmp_path, **tiny)
    assert second.source == "cache" and second.bfloat16_prefill == first.bfloat16_prefill


@needs_kernels
@pytest.mark.parametrize("bits,rows", [(16, 1), (8, 1), (16, 13)])
def test_rounded_activations_too_small_for_a_normal_scale_are_multiplied_in_float32(bits, rows):
    # max |x| about 3e-34 (16 bits) or 3e-37 (8 bits): the scale (max / 32767 or max / 127) would be
    # subnormal, so the product rounds nothing (rounding those groups to zero would drop them).
    generator = torch.Generator().manual_seed(11)
    blocks = random_q4_1(46, 96, generator)
    layer = Q4_1Linear(blocks)
    x = torch.randn(rows, 96, generator=generator)
    x[-1] *= {16: 1e-34, 8: 1e-37}[bits]  # one row suffices: the whole product is float32 then
    with code_with(bits), torch.inference_mode():
        got = layer(x).double()
    expected = x.double() @ blocks.dequantize().double().T
    assert relative_error(got[-1], expected[-1]) < 1e-5
    if rows > 1:  # the other rows in float32 too, not rounded to 16 bits (about 1e-5)
        assert relative_error(got[:-1], expected[:-1]) < 1e-6


@needs_kernels
@pytest.mark.parametrize("avx512,rows", [(False, 1), (False, 16), pytest.param(True, 16, marks=needs_avx512)])
def test_tiny_activations_against_tiny_weight_scales_keep_their_precision(avx512, rows):
    # x near 4e-34 (its 16-bit scale just normal) and float16's smallest weight scale, 6e-8: their
    # product, 1e-44 as one factor, would underflow; the sums are scaled by each in turn instead.
    generator = torch.Generator().manual_seed(14)
    blocks = random_q4_1(12, 64, generator)
    blocks = Q4_1Blocks(blocks.q, torch.full_like(blocks.d, 6e-8), torch.full_like(blocks.m, -5e-7))
    x = torch.randn(rows, 2, 32, generator=generator)
    x = (x / x.abs().amax(-1, keepdim=True) * 4e-34).view(rows, 64)
    with code_with(16, avx512=avx512, vnni=VNNI), torch.inference_mode():
        got = Q4_1Linear(blocks)(x).double()
    assert relative_error(got, x.double() @ blocks.dequantize().double().T) < 1e-4


@needs_kernels
@pytest.mark.parametrize("bits,rows", [(16, 1), (8, 1), (16, 13)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_infinite_activation_reaches_the_output_as_in_float32(bits, rows, bad):
    # Rounding would make it 0 (its group's scale is not finite): the product runs in float32 instead,
    # where it spreads to the whole output row as in torch's product.
    generator = torch.Generator().manual_seed(13)
    blocks = random_q4_1(46, 96, generator)
    x = torch.randn(rows, 96, generator=generator)
    x[-1, 37] = bad
    with code_with(bits), torch.inference_mode():
        got = Q4_1Linear(blocks)(x)
    assert not got[-1].isfinite().any()  # (an infinity times a centred nibble of 0 may be NaN, not inf)
    if bad != bad:
        assert got[-1].isnan().all()
    if rows > 1:  # the other rows in float32 too
        assert relative_error(got[:-1], (x @ blocks.dequantize().T)[:-1]) < 1e-6


@needs_avx512
def test_q4_1_to_bfloat16_keeps_a_nan_a_nan():
    blocks = random_q4_1(2, 32, torch.Generator().manual_seed(12))
    d = blocks.d.clone()
    d[0, 0] = torch.tensor(float("nan")).half()  # 0x7FFF after the float32 product: rounding would carry
    layer = Q4_1Linear(Q4_1Blocks(blocks.q, d, blocks.m))
    converted = KERNELS.q4_1_to_bfloat16(layer.qs, layer.d, layer.m)
    assert converted[0].isnan().all() and not converted[1].isnan().any()
