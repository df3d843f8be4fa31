"""A GGUF file is a model: a tiny random Llama written as GGUF (gguf-py's writer, llama.cpp's q/k
row order) gives the logits of transformers' modeling on the same (dequantized) weights, and a
broken file is a start-up error naming the problem."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

gguf = pytest.importorskip("gguf")

from inference import cpu_kernels  # noqa: E402
from inference.families import llama as family  # noqa: E402
from inference.formats import ggml  # noqa: E402
from inference.formats.gguf import GGUFFile, ModelFileError  # noqa: E402
from inference.llama import LlamaModelRunner  # noqa: E402
from inference.model_loader import end_of_generation_ids, gguf_file_of  # noqa: E402
from inference.model_runner import PrefillChunk  # noqa: E402
from inference.weights import STEP_GGML  # noqa: E402
from testing import tiny_families  # noqa: E402

LAYERS = tiny_families.LAYERS


def _tiny_llama(seed: int = 0):
    return tiny_families.tiny_family_model("llama", seed)


def _write(model, path: Path, kind: int, *, corrupt: str = "") -> dict[str, np.ndarray]:
    return tiny_families.write_gguf(model, path, kind, corrupt=corrupt)


def _reference(model, stored: dict[str, np.ndarray]):
    return tiny_families.stored_reference(model, stored)


TYPES = [ggml.F32, ggml.F16, ggml.Q8_0, ggml.Q4_0, ggml.Q4_1, ggml.Q5_0, ggml.Q5_1]


@pytest.mark.parametrize("kind", TYPES, ids=[ggml.type_name(kind) for kind in TYPES])
def test_a_gguf_llama_gives_transformers_logits_on_its_stored_weights(tmp_path, kind):
    needs_kernels = kind not in (ggml.F32,)
    if needs_kernels and cpu_kernels.load(None) is None:
        pytest.skip("our CPU kernels cannot run here")
    model = _tiny_llama()
    stored = _write(model, tmp_path / "tiny.gguf", kind)
    reference = _reference(model, stored)
    file = GGUFFile(tmp_path / "tiny.gguf")
    config = family.config_from_gguf(file)
    try:
        weights = family.gguf_weights(file, config, torch.float32)
    except NotImplementedError as error:
        pytest.skip(str(error))
    runner = LlamaModelRunner(weights, max_batch_size=2)
    ids = [5, 17, 33, 2, 90, 41, 8]
    with torch.inference_mode():
        got = runner.prefill([PrefillChunk(1, ids, 0, True)])[0]
        expected = reference(torch.tensor([ids])).logits[0]
    scale = expected.abs().max()
    # Float formats: float32 rounding; block formats: our products may round x to 16 bits per group.
    tolerance = 1e-4 if kind == ggml.F32 else 2e-3
    assert (got - expected).abs().max() <= tolerance * scale


def test_decode_continues_a_gguf_prompt_as_transformers_does(tmp_path):
    if cpu_kernels.load(None) is None:
        pytest.skip("our CPU kernels cannot run here")
    model = _tiny_llama(1)
    reference = _reference(model, _write(model, tmp_path / "tiny.gguf", ggml.Q8_0))
    file = GGUFFile(tmp_path / "tiny.gguf")
    runner = LlamaModelRunner(family.gguf_weights(file, family.config_from_gguf(file), torch.float32), max_batch_size=2)
    ids = [3, 9, 27, 81]
    with torch.inference_mode():
        runner.prefill([PrefillChunk(1, ids, 0, False)])
        runner.join(1, 1)
        got = runner.decode([44])[0]
        expected = reference(torch.tensor([ids + [44]])).logits[0, -1]
    assert (got - expected).abs().max() <= 2e-3 * expected.abs().max()


def test_the_float32_mode_dequantizes_a_gguf_into_exact_float32_layers(tmp_path):
    model = _tiny_llama(2)
    reference = _reference(model, _write(model, tmp_path / "tiny.gguf", ggml.Q4_1))
    file = GGUFFile(tmp_path / "tiny.gguf")
    runner = LlamaModelRunner(
        family.gguf_weights(file, family.config_from_gguf(file), torch.float32, "float32"), kernels=None
    )
    ids = [1, 2, 3, 4, 5]
    with torch.inference_mode():
        got = runner.prefill([PrefillChunk(1, ids, 0, True)])[0]
        expected = reference(torch.tensor([ids])).logits[0]
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max())


# --- broken files ---------------------------------------------------------------------------------


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b'{"model_type": "llama"}' + bytes(64))
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        GGUFFile(path)


def test_a_truncated_file_is_refused_naming_the_tensor(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(_tiny_llama(), path, ggml.Q8_0)
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(tmp_path / "cut.gguf")
    (tmp_path / "header.gguf").write_bytes(data[:200])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(tmp_path / "header.gguf")


def test_a_tensor_of_a_type_we_cannot_run_is_refused_by_name_and_type(tmp_path):
    path = tmp_path / "q2k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor(
        "blk.0.attn_q.weight", np.zeros((4, 84), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q2_K
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match=r"blk\.0\.attn_q\.weight has ggml type Q2_K"):
        GGUFFile(path)


def test_a_type_no_library_knows_is_named_by_its_number(tmp_path):
    path = tmp_path / "unknown.gguf"
    _write(_tiny_llama(), path, ggml.F32)
    reader = gguf.GGUFReader(path)
    tensor = reader.tensors[0]
    offset = tensor.field.parts[4].ctypes.data - reader.data.ctypes.data  # the record's ggml type id
    name = tensor.name
    del tensor, reader
    data = bytearray(path.read_bytes())
    data[offset : offset + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=rf"{re.escape(name)} has ggml type 99, which this server cannot run"):
        GGUFFile(path)


@pytest.mark.parametrize("path", ["/no/such/model.gguf", "models/missing.gguf", "./missing", "~/a/b/c"])
def test_a_missing_path_that_cannot_be_a_hub_id_is_refused_as_missing(path):
    with pytest.raises(ModelFileError, match="no such file or folder"):
        gguf_file_of(path)


def test_a_hub_id_and_a_folder_without_a_model_are_told_apart(tmp_path):
    assert gguf_file_of("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # left to transformers and the hub
    with pytest.raises(ModelFileError, match="holds neither a GGUF file nor a transformers model's config.json"):
        gguf_file_of(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert gguf_file_of(str(tmp_path)) is None  # a transformers folder


def test_shapes_that_disagree_with_the_metadata_are_refused(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(_tiny_llama(), path, ggml.F32, corrupt="kv_heads")
    with pytest.raises(ModelFileError, match=r"attn_k\.weight has shape \[32, 64\], but the metadata says \[16, 64\]"):
        family.config_from_gguf(GGUFFile(path))


def test_a_kv_head_count_that_does_not_divide_the_heads_is_refused(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(_tiny_llama(), path, ggml.F32, corrupt="kv_groups")
    with pytest.raises(
        ModelFileError, match=r"llama\.attention\.head_count 4 is not a multiple of llama\.attention\.head_count_kv 3"
    ):
        family.config_from_gguf(GGUFFile(path))


def test_q4_k_blocks_become_q4_1_groups_of_the_same_values():
    rng = np.random.default_rng(0)
    rows, width = 6, 512
    blocks = rng.integers(0, 256, size=(rows, width // 256, 144), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-1, size=(rows, width // 256, 2)).astype(np.float16)
    blocks[..., 0:4] = scales.view(np.uint8).reshape(rows, width // 256, 4)  # d and dmin in their real range
    raw = torch.from_numpy(blocks.reshape(rows, -1))
    qs, d, m = ggml.q4_1_parts(raw, ggml.Q4_K)
    values = torch.cat([(qs.reshape(rows, -1, 16) & 0x0F), (qs.reshape(rows, -1, 16) >> 4)], dim=-1).float()
    ours = (values * d[..., None] + m[..., None]).reshape(rows, width)
    assert torch.equal(ours, ggml.dequantize(raw, ggml.Q4_K, width))


@pytest.fixture
def sixteen_bits(kernel_choices):
    """x rounded to 16 bits in the few-row products, K-quants too, whatever an engine of this process set."""
    kernel_choices.set_activation_bits(16)
    kernel_choices.set_k_quant_int8(False)


def test_a_q4_k_tensor_runs_as_stored_at_few_rows_and_on_its_q4_1_copy_beyond(sixteen_bits):
    rng = np.random.default_rng(1)
    rows, width = 16, 512
    blocks = rng.integers(0, 256, size=(rows, width // 256, 144), dtype=np.uint8)
    blocks[..., 0:4] = rng.uniform(1e-3, 1e-1, size=(rows, width // 256, 2)).astype(np.float16).view(np.uint8)
    raw = torch.from_numpy(blocks.reshape(rows, -1))
    layer = ggml.linear(raw, ggml.Q4_K, width)
    if not isinstance(layer, ggml.GGMLLinear):
        pytest.skip("no CPU kernels here")
    weight = ggml.dequantize(raw, ggml.Q4_K, width)
    assert layer.raw.data_ptr() == raw.data_ptr()  # the file's own bytes, no copy
    assert layer.step_parts(4) == [(STEP_GGML, raw.data_ptr(), ggml.Q4_K, 0, rows)]  # the blocks as stored
    assert layer.step_parts(5) == layer.many.step_parts(5)  # the Q4_1 copy's kernel
    for count in (1, 4, 5, 8):
        x = torch.randn(count, width, generator=torch.Generator().manual_seed(count))
        expected = x @ weight.T
        assert torch.allclose(layer(x), expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))


def test_a_q4_k_tensor_under_8_bits_runs_as_stored_at_any_rows_and_builds_no_copy(sixteen_bits):
    kernels = cpu_kernels.load(None)
    rows, width = 40, 512
    rng = np.random.default_rng(2)
    blocks = rng.integers(0, 256, size=(rows, width // 256, 144), dtype=np.uint8)
    blocks[..., 0:4] = rng.uniform(1e-3, 1e-1, size=(rows, width // 256, 2)).astype(np.float16).view(np.uint8)
    raw = torch.from_numpy(blocks.reshape(rows, -1))
    layer = ggml.linear(raw, ggml.Q4_K, width)
    if not isinstance(layer, ggml.GGMLLinear) or not kernels.k_quant_int8_available:
        pytest.skip("no 8-bit K-quant products here")
    kernels.set_k_quant_int8(True)
    for count in (1, 5, 33):
        assert layer.step_parts(count) == [(STEP_GGML, raw.data_ptr(), ggml.Q4_K, 0, rows)]
        x = torch.randn(count, width, generator=torch.Generator().manual_seed(count))
        assert torch.equal(layer(x), kernels.ggml_gemm(x, raw, ggml.Q4_K))  # the 8-bit product of the blocks
    assert layer._many is None and layer.nbytes == raw.numel()  # no Q4_1 copy was made


def test_a_q4_k_tensor_built_under_8_bits_is_interleaved_where_its_rows_group_by_8(sixteen_bits):
    kernels = cpu_kernels.load(None)
    if not kernels.k_quant_int8_available or not (kernels.avx512 and kernels.vnni):
        pytest.skip("no 8-bit K-quant products on AVX-512 VNNI here: Q4_K loads as stored")
    kernels.set_k_quant_int8(True)  # the engine's default, before the layer is built
    for rows, kind in ((40, ggml.Q4_K_X8), (12, ggml.Q4_K)):
        raw = random_q4_k(rows, 512, seed=rows)
        layer = ggml.linear(raw, ggml.Q4_K, 512)
        assert isinstance(layer, ggml.GGMLLinear) and layer.kind == kind
        assert (layer.raw.data_ptr() != raw.data_ptr()) == (kind == ggml.Q4_K_X8)  # a copy, rearranged
        assert layer.step_parts(1) == [(STEP_GGML, layer.raw.data_ptr(), kind, 0, rows)]
        assert torch.equal(layer.dequantized(), ggml.dequantize(raw, ggml.Q4_K, 512))
        x = torch.randn(5, 512, generator=torch.Generator().manual_seed(rows))
        stored = kernels.ggml_gemm(x, raw, ggml.Q4_K)  # the 8-bit product of the blocks as stored
        assert (layer(x) - stored).abs().max() <= 1e-5 * stored.abs().max()
    kernels.set_avx512(False)  # the AVX2 code keeps the blocks as stored (its panels are faster)
    assert ggml.linear(random_q4_k(40, 512, seed=1), ggml.Q4_K, 512).kind == ggml.Q4_K


def test_loading_logs_its_progress(tmp_path, caplog):
    model = _tiny_llama(3)
    _write(model, tmp_path / "tiny.gguf", ggml.F32)
    file = GGUFFile(tmp_path / "tiny.gguf")
    with caplog.at_level(logging.INFO, logger="inference.families.llama"):
        family.gguf_weights(file, family.config_from_gguf(file), torch.float32)
    assert f"tiny.gguf: 1 of {LAYERS} layers read" in caplog.text


def test_every_end_of_generation_token_of_a_file_stops_generation(tmp_path):
    # Llama 3's file: eos <|end_of_text|>, eot <|eot_id|>; both end a stream, as in its generation config.
    writer = gguf.GGUFWriter(tmp_path / "tokens.gguf", "llama")
    writer.add_token_list(["<|begin_of_text|>", "hello", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "world"])
    writer.add_eos_token_id(2)
    writer.add_uint32("tokenizer.ggml.eot_token_id", 3)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file = GGUFFile(tmp_path / "tokens.gguf")
    assert end_of_generation_ids(file) == [2, 3, 4]


def random_q4_k(rows: int, width: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, width // 256, 144), dtype=np.uint8)
    blocks[..., 0:4] = rng.uniform(1e-3, 1e-1, size=(rows, width // 256, 2)).astype(np.float16).view(np.uint8)
    return torch.from_numpy(blocks.reshape(rows, -1))


def test_a_long_chunk_of_a_k_quant_layer_multiplies_a_bfloat16_copy(sixteen_bits):
    """From bfloat16_rows rows on, the product is oneDNN's of x and the weight rounded to bfloat16
    (a copy made per call, into a reused buffer); below it, our block products; not a one-call step part."""
    if not cpu_kernels.avx512_products():
        pytest.skip("the bfloat16 copies need the AVX-512 products")
    raw = random_q4_k(24, 512, seed=3)
    layer = ggml.linear(raw, ggml.Q4_K, 512)
    assert isinstance(layer, ggml.GGMLLinear)
    layer.bfloat16_rows = 5
    weight = ggml.dequantize(raw, ggml.Q4_K, 512).bfloat16()
    for rows in (5, 9):
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(layer(x), F.linear(x.bfloat16(), weight).float())
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(4))
    assert torch.equal(layer(x), cpu_kernels.load(None).ggml_gemm(x, raw, ggml.Q4_K))
    assert layer.step_parts(5) is None and layer.step_parts(4) is not None


def test_a_long_chunk_of_stacked_block_layers_is_one_product_of_their_copies_side_by_side(sixteen_bits):
    """Stacked parts (q/k/v of two types) past bfloat16_rows: one oneDNN product of the parts'
    bfloat16 copies side by side, no concatenation of outputs; below it, each part's own product."""
    if not cpu_kernels.avx512_products():
        pytest.skip("the bfloat16 copies need the AVX-512 products")
    raws = [random_q4_k(16, 512, seed=5), random_q4_k(8, 512, seed=6)]
    parts = [ggml.linear(raw, ggml.Q4_K, 512) for raw in raws]
    stacked = ggml.StackedLinear(parts)
    for part in parts:
        part.bfloat16_rows = 5
    weight = torch.cat([ggml.dequantize(raw, ggml.Q4_K, 512) for raw in raws]).bfloat16()
    x = torch.randn(7, 512, generator=torch.Generator().manual_seed(7))
    assert torch.equal(stacked(x), F.linear(x.bfloat16(), weight).float())
    assert stacked.compute(x).dtype == torch.bfloat16  # the product's own output, for the GLU kernel
    assert torch.equal(stacked.compute(x).float(), stacked(x))
    few = x[:4]
    assert torch.equal(stacked(few), torch.cat([part(few) for part in parts], dim=-1))


def test_a_long_chunks_mlp_passes_bfloat16_from_gate_up_to_down_as_the_float32_path_rounds_it(sixteen_bits):
    """The runner's MLP on a long chunk: gate/up's bfloat16 output goes through the GLU kernel in
    bfloat16 and into down's bfloat16 product and the residual, with the values the float32 GLU
    gave (down rounds its input to bfloat16 either way)."""
    if not cpu_kernels.avx512_products():
        pytest.skip("the bfloat16 copies need the AVX-512 products")
    kernels = cpu_kernels.load(None)
    gate_up = ggml.StackedLinear([ggml.linear(random_q4_k(256, 512, seed=s), ggml.Q4_K, 512) for s in (8, 9)])
    down_raw = random_q4_k(512, 256, seed=10)
    down = ggml.linear(down_raw, ggml.Q4_K, 256)
    for layer in (*gate_up.parts, down):
        layer.bfloat16_rows = 5
    x = torch.randn(7, 512, generator=torch.Generator().manual_seed(11))
    gated = kernels.silu_mul(gate_up.compute(x))
    assert gated.dtype == torch.bfloat16
    assert torch.equal(gated, kernels.silu_mul(gate_up(x)).bfloat16())
    residual = torch.randn(7, 512, generator=torch.Generator().manual_seed(12))
    expected = residual + F.linear(gated, ggml.dequantize(down_raw, ggml.Q4_K, 256).bfloat16()).float()
    down.add_into(gated, residual)
    assert torch.equal(residual, expected)
    few = gated[:4]  # below bfloat16_rows: our products, on the exact float32 widening of x
    assert torch.equal(down.compute(few), kernels.ggml_gemm(few.float(), down_raw, ggml.Q4_K))


@pytest.mark.parametrize("copy_seconds", [1.0, 3.0])
def test_bfloat16_prefill_is_chosen_where_the_copy_and_its_product_take_under_our_time(monkeypatch, copy_seconds):
    """The timing of a type's largest block layer decides for every layer of that type, stacked parts
    too, and each type is timed on its own."""
    if cpu_kernels.load(None) is None:
        pytest.skip("no CPU kernels here")
    from inference import weights

    clock = [0.0]
    timed = []
    monkeypatch.setattr(ggml, "bfloat16_prefill_available", lambda: True)
    monkeypatch.setattr(ggml, "interleaves", lambda kind, rows: False)  # Q4_K as stored, whatever an engine set
    monkeypatch.setattr(ggml.time, "perf_counter", lambda: clock[0])

    def compute(self, x):
        timed.append(self.out_features)
        if self.kind == ggml.Q4_K:
            clock[0] += copy_seconds if self._in_bfloat16(x.shape[0]) else 2.0
        else:  # Q6_K: bfloat16 always the faster
            clock[0] += 1.0 if self._in_bfloat16(x.shape[0]) else 2.0
        return x

    monkeypatch.setattr(ggml.GGMLLinear, "compute", compute)
    monkeypatch.setattr(ggml.GGMLLinear, "_in_bfloat16", lambda self, rows: self.bfloat16_rows is not None)
    small, large, part = (ggml.linear(random_q4_k(rows, 256, rows), ggml.Q4_K, 256) for rows in (8, 32, 16))
    q6_k = ggml.linear(torch.zeros(12, 210, dtype=torch.uint8), ggml.Q6_K, 256)
    stacked = ggml.StackedLinear([part, ggml.linear(random_q4_k(8, 256, 9), ggml.Q4_K, 256)])
    chosen = ggml.choose_bfloat16_prefill([small, large, stacked, q6_k, lambda x: x])
    q4_k_chosen = copy_seconds < 2.0 * weights.BFLOAT16_PREFILL_GAIN
    assert chosen == (["Q4_K", "Q6_K"] if q4_k_chosen else ["Q6_K"])
    assert set(timed) == {32, 12}  # the largest Q4_K layer and the Q6_K one
    expected = weights.BFLOAT16_PREFILL_ROWS if q4_k_chosen else None
    assert [small.bfloat16_rows, large.bfloat16_rows, part.bfloat16_rows] == [expected] * 3
    assert q6_k.bfloat16_rows == weights.BFLOAT16_PREFILL_ROWS
    assert ggml.choose_bfloat16_prefill([lambda x: x]) == []  # no block layer: nothing timed


@pytest.mark.parametrize("down_kind", [ggml.F32, ggml.Q8_0, ggml.F16, ggml.Q4_K], ids=["f32", "q8_0", "f16", "q4_k"])
def test_a_down_product_that_is_not_in_bfloat16_gets_the_float32_glu_of_a_bfloat16_gate_up(sixteen_bits, down_kind):
    """A file whose gate/up run long chunks in bfloat16 but whose down does not (F32 or F16 tensors,
    or Q8_0, llama.cpp's fallback for Q6_K): the runner's MLP gives down the GLU in float32, as
    before gate/up's bfloat16 output went straight to the GLU kernel; rounding it to bfloat16 is
    free only where down rounds its input to bfloat16 anyway."""
    if not cpu_kernels.avx512_products():
        pytest.skip("the bfloat16 copies need the AVX-512 products")
    kernels = cpu_kernels.load(None)
    gate_up = ggml.StackedLinear([ggml.linear(random_q4_k(256, 512, seed=s), ggml.Q4_K, 512) for s in (13, 14)])
    for part in gate_up.parts:
        part.bfloat16_rows = 5
    if down_kind == ggml.Q4_K:  # the usual file: down in bfloat16 too, and the GLU's output in it
        down = ggml.linear(random_q4_k(512, 256, seed=15), ggml.Q4_K, 256)
        down.bfloat16_rows = 5
    else:
        values = torch.randn(512, 256, generator=torch.Generator().manual_seed(15)).numpy()
        raw = torch.from_numpy(gguf.quants.quantize(values, down_kind).view(np.uint8).copy())
        down = ggml.linear(raw.reshape(512, -1), down_kind, 256)
    runner = LlamaModelRunner.__new__(LlamaModelRunner)  # only what _mlp_add reads
    runner._kernels, runner._hidden_act, runner.eps = kernels, "silu", 1e-6
    runner.hidden_size, runner.intermediate_size = 512, 256
    post_norm = torch.ones(512)

    class Layer:
        pass

    layer = Layer()
    layer.gate_up, layer.down, layer.post_norm, layer.mlp_output_norm = gate_up, down.compute, post_norm, None
    layer.down_add, layer.products = down.add_into, (None, None, gate_up, down)
    x = torch.randn(7, 512, generator=torch.Generator().manual_seed(16))
    expected = x.clone()
    normed = kernels.rms_norm(x, post_norm, 1e-6)
    gated = kernels.silu_mul(gate_up.compute(normed) if down_kind == ggml.Q4_K else gate_up(normed))
    assert gated.dtype == (torch.bfloat16 if down_kind == ggml.Q4_K else torch.float32)
    down.add_into(gated, expected)
    runner._mlp_add(layer, x)
    assert torch.equal(x, expected)
