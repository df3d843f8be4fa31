"""``MODELS_MEMORY_BUDGET``: each model's weights and KV cache estimated from its file's header, and a
list of models that does not fit refused naming the budget and the model that passes it."""

from __future__ import annotations

import math

import pytest

from inference.footprint import MemoryBudgetExceeded, check_budget, estimate, model_shape
from inference.formats import ggml
from inference.models_config import ModelSpec
from testing import tiny_families


@pytest.fixture(scope="module")
def qwen3_gguf(tmp_path_factory):
    """A tiny Qwen3 GGUF (2 layers, 2 KV heads of 64, context 256) in Q8_0 blocks."""
    model = tiny_families.tiny_family_model("qwen3", vocab_size=len(tiny_families.vocabulary("qwen3")))
    path = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3.gguf"
    tiny_families.write_gguf(model, path, ggml.Q8_0, architecture="qwen3", tokenizer="qwen3")
    return path, sum(parameter.numel() for parameter in model.parameters())


def test_a_gguf_files_shape_comes_from_its_header(qwen3_gguf):
    path, parameters = qwen3_gguf

    shape = model_shape(str(path))

    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.context) == (2, 2, 64, 256)
    assert shape.parameters == parameters  # tied: the output layer is the embedding
    assert shape.stored_bytes < parameters * 4  # Q8_0's blocks: 34 bytes per 32 weights, vectors in F32


def test_a_gguf_served_in_its_blocks_counts_its_stored_bytes_and_another_format_its_weights(qwen3_gguf):
    path, parameters = qwen3_gguf
    shape = model_shape(str(path))

    assert estimate(ModelSpec(id="q", path=str(path), weights="auto")).weights == shape.stored_bytes
    assert estimate(ModelSpec(id="q", path=str(path), weights="float32")).weights == parameters * 4
    assert estimate(ModelSpec(id="q", path=str(path), weights="bfloat16")).weights == parameters * 2


def test_the_kv_cache_counts_every_row_at_the_full_context(qwen3_gguf):
    path, _ = qwen3_gguf
    per_position = 2 * 2 * 2 * 64 * 2  # keys and values, 2 layers, 2 KV heads of 64, float16

    full = estimate(ModelSpec(id="q", path=str(path), max_batch_size=4, kv_cache_mb=0))
    capped = estimate(ModelSpec(id="q", path=str(path), max_batch_size=4, context_length=64, kv_cache_mb=0))
    float32 = estimate(ModelSpec(id="q", path=str(path), weights="float32", max_batch_size=4, kv_cache_mb=0))

    assert (full.kv_cache, full.rows, full.context) == (4 * 256 * per_position, 4, 256)
    assert (capped.kv_cache, capped.context) == (4 * 64 * per_position, 64)
    assert float32.kv_cache == 2 * full.kv_cache  # the deterministic mode keeps float32 keys and values


def test_the_prefix_caches_budget_is_the_kv_caches_floor(qwen3_gguf):
    path, _ = qwen3_gguf

    footprint = estimate(ModelSpec(id="q", path=str(path), max_batch_size=1, context_length=16, kv_cache_mb=32))

    assert footprint.kv_cache == 32 << 20


def test_a_transformers_folder_is_read_from_its_config_and_safetensors_headers(tmp_path):
    from testing.tiny_model import tiny_model

    model = tiny_model(70)
    model.save_pretrained(tmp_path)  # safetensors, float32
    parameters = sum(parameter.numel() for parameter in model.parameters())

    shape = model_shape(str(tmp_path))
    footprint = estimate(ModelSpec(id="t", path=str(tmp_path), weights="auto", max_batch_size=2, kv_cache_mb=0))

    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.context) == (2, 2, 16, 256)
    assert shape.parameters == parameters and shape.stored_bytes == parameters * 4
    assert footprint.weights == parameters * 4  # auto may pick float32
    assert footprint.kv_cache == 2 * 256 * (2 * 2 * 2 * 16 * 2)


@pytest.mark.parametrize(
    "content",
    [
        b"abc",
        b"\x04\x00\x00\x00\x00\x00\x00\x00nope",
        b"\x02\x00\x00\x00\x00\x00\x00\x00[]",
        b'\x0b\x00\x00\x00\x00\x00\x00\x00{"w": {}}  ',
    ],
    ids=["too-short", "no-json", "no-object", "no-shape"],
)
def test_a_folder_whose_weights_cannot_be_read_is_refused_naming_the_model(tmp_path, content):
    (tmp_path / "config.json").write_text('{"num_attention_heads": 2, "hidden_size": 32, "num_hidden_layers": 2}')
    (tmp_path / "model.safetensors").write_bytes(content)

    with pytest.raises(ValueError) as refused:
        estimate(ModelSpec(id="broken", path=str(tmp_path)))

    assert str(refused.value).startswith('The model "broken" cannot be estimated from its files: ')
    assert "model.safetensors" in str(refused.value)


def test_a_folder_of_several_gguf_files_says_where_to_name_one(tmp_path, qwen3_gguf):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(qwen3_gguf[0].read_bytes())

    with pytest.raises(ValueError) as refused:
        estimate(ModelSpec(id="several", path=str(tmp_path)))

    assert str(refused.value).startswith('The model "several" cannot be estimated from its files: ')
    assert str(refused.value).endswith(
        'holds several GGUF files (a.gguf, b.gguf): name one in MODEL_PATH or in the model\'s "path" of MODELS_CONFIG'
    )


def test_the_embedded_model_is_estimated_from_its_q4_1_file():
    footprint = estimate(ModelSpec(id="e", path="", max_batch_size=8, context_length=2048, kv_cache_mb=0))

    assert 80 << 20 < footprint.weights < 100 << 20  # 135M weights in Q4_1 blocks, and F32 vectors
    assert footprint.kv_cache == 8 * 2048 * 2 * 30 * 3 * 64 * 2  # 30 layers of 3 KV heads of 64


def footprint(model: str, gib: float):
    from inference.footprint import Footprint

    return Footprint(model, int(gib * 2**30), 0, 1, 1)


def test_models_that_fit_together_pass():
    check_budget([footprint("small", 1), footprint("big", 6)], 7 << 30, "7GiB")
    check_budget([footprint("small", 100)], 0, "")  # no budget


def test_a_model_that_does_not_fit_is_refused_naming_the_budget_and_the_model():
    with pytest.raises(MemoryBudgetExceeded) as refused:
        check_budget([footprint("small", 1), footprint("big", 6.5)], 7 << 30, "7GiB")

    message = str(refused.value)
    assert message.startswith('The model "big" does not fit in MODELS_MEMORY_BUDGET=7GiB (7.00 GiB)')
    assert "6.00 GiB is left of it" in message and "it needs 6.50 GiB" in message
    assert '"small": 1.00 GiB of weights' in message


def test_the_estimate_rounds_a_formats_fraction_of_a_byte_up(qwen3_gguf):
    path, parameters = qwen3_gguf

    assert estimate(ModelSpec(id="q", path=str(path), weights="q4_1")).weights == math.ceil(parameters * 0.625)
