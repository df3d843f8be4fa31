"""Weight formats (inference.weights): each computes what float32 does within its stated tolerance,
int4 reproduces Q4_1 blocks, the autotune's cached choice is honoured and MODEL_WEIGHTS overrides it.

Tiny random matrices; nothing here is timed (bench/weight_formats.py measures speed).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from inference import weights
from inference.weights import (
    Choice,
    Int4Linear,
    Int8Linear,
    Plan,
    PlannedLinear,
    Q4_1Blocks,
    check_format,
    choose_formats,
    make_linear,
    quantize_q4_1,
    supported_formats,
)

# Tolerances, relative to the largest output of the product: bfloat16 rounds weights and activations
# to 8 significant bits (~0.4% each); int8 adds at most half a step of absmax/127 per weight; int4
# half a step of (max - min) / 15 per group, with bfloat16 activations and scales on top.
TOLERANCE = {"float32": 1e-6, "bfloat16": 2e-2, "int8": 3e-2, "int4": 1.5e-1, "q4_1": 1.5e-1, "q8_0": 1e-2}

# Tiny shapes for the autotune: timing them costs milliseconds.
TINY = {"layer_shapes": ((64, 64), (32, 64)), "layers": 2, "output_shape": (96, 64), "batch_sizes": (1, 4)}


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("name", supported_formats())
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (3, 2, 64), (40, 64)])
def test_each_format_computes_what_float32_does_within_its_tolerance(name, bias, act_dtype, shape):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=generator)
    bias_tensor = torch.randn(48, generator=generator) if bias else None
    x = torch.randn(*shape, generator=generator).to(act_dtype)
    with torch.inference_mode():
        got = make_linear(weight, bias_tensor, name)(x)
        expected = torch.nn.functional.linear(x.float(), weight, bias_tensor)
    assert got.shape == (*shape[:-1], 48) and got.dtype == act_dtype
    # bfloat16 activations are already rounded: the product of a format is compared with float32's of them.
    tolerance = max(TOLERANCE[name], 1e-2 if act_dtype == torch.bfloat16 else 0)
    assert relative_error(got, expected) <= tolerance


def synthetic_q4_1(out: int, inp: int, seed: int = 0) -> Q4_1Blocks:
    """Random Q4_1 blocks: 4-bit values, and scales and minimums that float32 (and bfloat16) hold exactly."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out, inp), dtype=torch.uint8, generator=generator)
    # Powers of two and small multiples of them: exact in float16, bfloat16 and float32, so that
    # m + 8 d (the kernel's zero) is exact too and d * q + m must come out exactly.
    d = (2.0 ** -torch.randint(4, 9, (out, inp // 32), generator=generator)).half()
    m = (-torch.randint(1, 8, (out, inp // 32), generator=generator) / 16).half()
    return Q4_1Blocks(q, d, m)


@pytest.mark.skipif("int4" not in supported_formats(), reason="no int4 kernel here")
def test_int4_from_q4_1_blocks_reproduces_d_times_q_plus_m_exactly():
    blocks = synthetic_q4_1(32, 96)
    expected = blocks.dequantize()  # d * q + m
    for compute_dtype in (torch.float32, torch.bfloat16):
        layer = Int4Linear(blocks, compute_dtype=compute_dtype)
        assert torch.equal(layer.dequantized().float(), expected)
    # And the kernel computes with them: one-hot inputs read the weight's columns back.
    layer = Int4Linear(blocks, compute_dtype=torch.float32)
    with torch.inference_mode():
        columns = layer(torch.eye(96))
    torch.testing.assert_close(columns, expected.T, rtol=0, atol=1e-6)


def test_q4_1_blocks_dequantize_as_ggml_orders_them():
    blocks = Q4_1Blocks(
        torch.arange(32, dtype=torch.uint8).remainder(16)[None],
        torch.tensor([[0.5]]).half(),
        torch.tensor([[-1.0]]).half(),
    )
    assert blocks.dequantize().tolist() == [[0.5 * (i % 16) - 1.0 for i in range(32)]]


def test_quantize_q4_1_keeps_every_weight_within_half_a_step():
    weight = torch.randn(8, 64)
    blocks = quantize_q4_1(weight)
    step = blocks.d.float().repeat_interleave(32, dim=1)
    # Half a step, plus the float16 rounding of d and m (relative 2^-11 of the group's range).
    assert ((blocks.dequantize() - weight).abs() <= step * 0.5 + 16 * step * 2**-10 + 1e-3).all()
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_q4_1(torch.randn(4, 40))


@pytest.mark.skipif("int8" not in supported_formats(), reason="no int8 kernel here")
def test_int8_scales_are_per_output_channel():
    weight = torch.randn(6, 64) * torch.logspace(-3, 1, 6)[:, None]
    layer = Int8Linear(weight, compute_dtype=torch.float32)
    assert layer.scales.shape == (6,)
    error = (layer.dequantized() - weight).abs().amax(dim=1)
    assert (error <= weight.abs().amax(dim=1) / 127 / 2 * 1.001).all()


def test_a_planned_linear_runs_the_format_planned_for_the_row_count():
    calls = []

    class Recorder(weights.WeightLinear):
        def __init__(self, name):
            self.format, self.in_features, self.out_features = name, 8, 4

        def __call__(self, x):
            calls.append((self.format, x.numel() // 8))
            return x.new_zeros(*x.shape[:-1], 4)

    plan = Plan(((2, "a"), (16, "b"), (None, "c")))
    layer = PlannedLinear({name: Recorder(name) for name in "abc"}, plan)
    for shape in [(1, 8), (2, 1, 8), (3, 8), (4, 4, 8), (17, 8), (300, 8)]:
        layer(torch.zeros(shape))
    assert calls == [("a", 1), ("a", 2), ("b", 3), ("b", 16), ("c", 17), ("c", 300)]
    assert plan.describe() == "a for 1-2 rows, b for 3-16 rows, c for 17+ rows"


def test_make_linear_with_a_plan_of_two_formats_holds_both():
    layer = make_linear(torch.randn(16, 64), None, Plan(((2, "float32"), (None, "float32"))))
    assert layer.format == "float32"  # one distinct format: no dispatch
    if "int8" in supported_formats():
        layer = make_linear(torch.randn(16, 64), None, Plan(((2, "int8"), (None, "float32"))))
        assert isinstance(layer, PlannedLinear) and set(layer.layers) == {"int8", "float32"}


OTHERS_SHARE = weights._others_share  # the function itself, before the fixture below replaces it


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """Other programs took none of the CPUs while the autotune timed (the caching tests need it)."""
    monkeypatch.setattr(weights, "_others_share", lambda *args: 0.0)


def test_a_choice_timed_on_a_busy_machine_is_not_cached(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(weights, "_others_share", lambda *args: 0.5)
    assert choose_formats(cache_dir=tmp_path, **TINY).source == "autotune"
    assert not list(tmp_path.glob("*.json"))
    assert "other programs used 50% of the CPUs" in caplog.text


def test_the_share_of_other_programs_comes_from_the_machines_and_the_process_cpu_time():
    # 3 CPU seconds busy in all over 1 s on the machine's CPUs, 1 of them this process's.
    cpus = os.cpu_count() or 1
    assert OTHERS_SHARE((10.0, 5.0), (13.0, 6.0), 1.0) == pytest.approx(2.0 / cpus)
    assert OTHERS_SHARE((10.0, 5.0), (10.5, 6.0), 1.0) == 0.0  # never below zero
    assert OTHERS_SHARE(None, (1.0, 1.0), 1.0) == 0.0  # unknown: not busy
    assert weights._cpu_seconds() is None or weights._cpu_seconds()[0] > 0


def test_the_autotunes_choice_is_cached_and_honoured_on_the_next_call(tmp_path, monkeypatch):
    first = choose_formats(cache_dir=tmp_path, **TINY)
    assert first.source == "autotune"
    [cached] = tmp_path.glob("*.json")
    # Rewrite the cached plan to one the timings would not give: the next call must use it as is.
    data = json.loads(cached.read_text())
    data["layers"], data["output"] = [[4, "float32"], [None, "float32"]], [[None, "float32"]]
    cached.write_text(json.dumps(data))
    monkeypatch.setattr(weights, "_time_sweeps", lambda *a, **k: pytest.fail("timed again despite the cache"))
    second = choose_formats(cache_dir=tmp_path, **TINY)
    assert second.source == "cache"
    assert second.layers == Plan(((4, "float32"), (None, "float32"))) and second.output == Plan.single("float32")


def test_the_cache_is_keyed_by_cpu_capability_and_shapes(tmp_path, monkeypatch):
    choose_formats(cache_dir=tmp_path, **TINY)
    monkeypatch.setattr(weights, "cpu_capability", lambda: "SOME_OTHER_ISA")
    assert choose_formats(cache_dir=tmp_path, **TINY).source == "autotune"
    assert len(list(tmp_path.glob("*.json"))) == 2


@pytest.mark.parametrize("requested", supported_formats())
def test_model_weights_overrides_the_cached_choice(tmp_path, requested):
    choose_formats(cache_dir=tmp_path, **TINY)
    choice = choose_formats(requested, cache_dir=tmp_path, **TINY)
    assert choice == Choice(Plan.single(requested), Plan.single(requested), "requested")


def test_an_unsupported_format_is_a_clear_value_error(monkeypatch):
    monkeypatch.setattr(weights, "supported_formats", lambda: ("float32",))
    with pytest.raises(ValueError, match="'int4' is not supported on this CPU"):
        check_format("int4")
    with pytest.raises(ValueError, match="not supported on this CPU"):
        make_linear(torch.randn(4, 32), None, "bfloat16")
    with pytest.raises(ValueError, match="not supported on this CPU"):
        choose_formats("int8")
    with pytest.raises(ValueError, match="must be one of auto, float32, bfloat16, int8, int4, q4_1, q8_0, not 'int3'"):
        choose_formats("int3")


def test_the_plan_keeps_to_the_memory_budget():
    timings = {"float32": {1: 10.0, 32: 5.0}, "int8": {1: 4.0, 32: 20.0}, "int4": {1: 5.5, 32: 8.0}}
    sizes = {"float32": 400, "int8": 100, "int4": 60}
    assert weights.plan_from_timings(timings, (1, 32), sizes, 1000) == Plan(((5, "int8"), (None, "float32")))
    # float32 + int8 do not fit 450: the single format with the least slowdown (int4: 1.375 + 1.6).
    assert weights.plan_from_timings(timings, (1, 32), sizes, 450) == Plan.single("int4")


def test_a_second_format_is_kept_only_for_a_gain_beyond_the_autotunes_noise():
    sizes = {"q8_0": 32, "bfloat16": 57, "float32": 113}
    # bfloat16 wins at 32 rows by less than NEAR_FASTEST (these are a starting server's timings):
    # one copy of the output layer, in q8_0, the format fast at every batch size.
    timings = {"q8_0": {1: 2.2, 8: 3.68, 32: 15.68}, "bfloat16": {1: 3.63, 8: 5.12, 32: 12.7}}
    assert weights.plan_from_timings(timings, (1, 8, 32), sizes, 1000) == Plan.single("q8_0")
    # A larger gain keeps both.
    timings["bfloat16"][32] = 10.0
    assert weights.plan_from_timings(timings, (1, 8, 32), sizes, 1000) == Plan(((16, "q8_0"), (None, "bfloat16")))
    # Where two formats are fast at as many batch sizes, the smaller.
    timings = {"float32": {1: 10.0, 32: 10.0}, "bfloat16": {1: 11.0, 32: 11.0}}
    assert weights.plan_from_timings(timings, (1, 32), sizes, 1000) == Plan.single("bfloat16")
    # When the fast formats together pass the budget, the fastest at each batch size, if they fit
    # (the embedded layers' sizes in MB; found by the adversary: the rule fell back to one format).
    timings = {
        "q4_1": {1: 10.0, 8: 50.0, 32: 200.0},
        "bfloat16": {1: 12.0, 8: 24.0, 32: 80.0},
        "float32": {1: 15.0, 8: 20.0, 32: 40.0},
    }
    sizes = {"q4_1": 76, "bfloat16": 202, "float32": 405}
    assert weights.plan_from_timings(timings, (1, 8, 32), sizes, 600) == Plan(((2, "q4_1"), (None, "float32")))
    # A NaN timing counts as never fast.
    timings = {"a": {1: math.nan, 32: 5.0}, "b": {1: 4.0, 32: 6.0}}
    assert weights.plan_from_timings(timings, (1, 32), {"a": 1, "b": 1}, 10) == Plan.single("b")


def test_model_weights_setting_reaches_the_model_config(settings):
    from inference.model_loader import ModelConfig

    assert settings.MODEL_WEIGHTS == "auto" and ModelConfig(path="", model_id="m").weights == "auto"


def test_q4_1_nibbles_pack_and_unpack_in_ggml_order():
    q = synthetic_q4_1(4, 64).q
    packed = weights._pack_nibbles(q)
    assert packed.shape == (4, 32)
    assert packed[0, 0].item() == q[0, 0].item() | (q[0, 16].item() << 4)  # weights i and i + 16 share a byte
    assert torch.equal(weights._unpack_nibbles(packed), q)


def write_gguf(path, tensors: dict[str, Q4_1Blocks]) -> None:
    """A GGUF file of Q4_1 tensors (ggml's block_q4_1 bytes: d, m as float16, then 16 bytes of nibbles)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    for name, blocks in tensors.items():
        rows = blocks.q.shape[0]
        raw = np.concatenate(
            [
                blocks.d.numpy().view(np.uint8).reshape(rows, -1, 2),
                blocks.m.numpy().view(np.uint8).reshape(rows, -1, 2),
                weights._pack_nibbles(blocks.q).numpy().reshape(rows, -1, 16),
            ],
            axis=-1,
        )
        writer.add_tensor(name, raw.reshape(rows, -1), raw_dtype=GGMLQuantizationType.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_cpp_permute(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to q/k rows (each head's rotary halves interleaved)."""
    out = rows.shape[0]
    return rows.reshape(heads, 2, out // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def test_gguf_q4_1_blocks_read_back_in_transformers_order_and_from_the_cache(tmp_path):
    q_proj, v_proj = synthetic_q4_1(32, 64, seed=1), synthetic_q4_1(16, 64, seed=2)
    index = llama_cpp_permute(torch.arange(32), heads=4)
    write_gguf(tmp_path / "tiny.gguf", {"blk.0.attn_q.weight": q_proj.rows(index), "blk.0.attn_v.weight": v_proj})
    for _attempt in range(2):  # read, then from the cache
        blocks = weights.load_q4_1_blocks(tmp_path / "tiny.gguf", 4, 2, tmp_path / "cache")
        assert set(blocks) == {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight"}
        for got, expected in (
            (blocks["model.layers.0.self_attn.q_proj.weight"], q_proj),
            (blocks["model.layers.0.self_attn.v_proj.weight"], v_proj),
        ):
            assert torch.equal(got.q, expected.q) and torch.equal(got.d, expected.d) and torch.equal(got.m, expected.m)
        assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 1
    # The cache is keyed by the file's contents: the same file elsewhere (a new virtual environment)
    # is read from it, a changed file is read anew.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "tiny.gguf").write_bytes((tmp_path / "tiny.gguf").read_bytes())
    weights.load_q4_1_blocks(tmp_path / "elsewhere" / "tiny.gguf", 4, 2, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 1
    write_gguf(tmp_path / "elsewhere" / "tiny.gguf", {"blk.0.attn_v.weight": v_proj})
    changed = weights.load_q4_1_blocks(tmp_path / "elsewhere" / "tiny.gguf", 4, 2, tmp_path / "cache")
    assert set(changed) == {"model.layers.0.self_attn.v_proj.weight"}
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 2


def test_auto_picks_only_formats_measured_no_worse_than_what_shipped(tmp_path):
    choice = choose_formats(cache_dir=tmp_path, **TINY)
    assert set(choice.layers.formats + choice.output.formats) <= set(weights.AUTO_FORMATS)
    assert "int8" not in weights.AUTO_FORMATS and "int4" not in weights.AUTO_FORMATS  # see AUTO_FORMATS' measurements


def test_auto_dtype_is_float32_where_the_fused_decode_step_runs(monkeypatch):
    """The fused decode step takes float32 activations, so ``auto`` takes float32 there even on a
    CPU with native bfloat16 (issue 12); elsewhere such a CPU still gets bfloat16."""
    from inference import model_loader

    cpu = torch.device("cpu")
    monkeypatch.setattr(model_loader, "_cpu_has_bf16", lambda: True)
    assert model_loader.resolve_dtype("auto", cpu, fused_decode=True) == torch.float32
    assert model_loader.resolve_dtype("auto", cpu) == torch.bfloat16
    assert model_loader.resolve_dtype("bfloat16", cpu, fused_decode=True) == torch.bfloat16
    monkeypatch.setattr(model_loader, "_cpu_has_bf16", lambda: False)
    assert model_loader.resolve_dtype("auto", cpu) == torch.float32


def test_the_output_layer_goes_with_the_layers_q4_1_kernel():
    """output_beside_kernels: q8_0 where the layers run q4_1; the tuned format elsewhere."""
    from inference.weights import Choice, Plan, output_beside_kernels

    tuned = Choice(Plan(((16, "q4_1"), (None, "bfloat16"))), Plan.single("bfloat16"), "autotune")
    merged = output_beside_kernels(tuned)
    assert merged.output == Plan(((16, "q8_0"), (None, "bfloat16")))
    assert merged.layers == tuned.layers
    assert output_beside_kernels(
        Choice(Plan(((2, "q4_1"), (None, "float32"))), Plan.single("float32"), "x")
    ).output == Plan(((2, "q8_0"), (None, "float32")))
    assert output_beside_kernels(Choice(Plan.single("float32"), Plan.single("float32"), "x")).output == Plan.single(
        "float32"
    )
    assert output_beside_kernels(Choice(Plan.single("q4_1"), Plan.single("bfloat16"), "x")).output == Plan.single(
        "q8_0"
    )
