"""Each model family on the shared runner gives transformers' logits and greedy text: a tiny random
model of the family's real config shape (:mod:`testing.tiny_families`), run from the transformers
model itself and from a GGUF file of it in each file format, against transformers' modeling on the
same (dequantized) weights.

Bounds: float formats (the transformers model, F32 and F16 files, whose float16 values are exact in
float32) within 1e-4 of the largest logit, float32's own noise; block formats within 2e-3, our block
products computing in other orders and rounding as the file's own blocks do (the existing Llama
bound of tests/unit/test_gguf_loading.py).
"""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf")

from inference import cpu_kernels  # noqa: E402
from inference.families import llama as family  # noqa: E402
from inference.formats import ggml  # noqa: E402
from inference.formats.gguf import GGUFFile  # noqa: E402
from inference.llama import LlamaModelRunner  # noqa: E402
from inference.model_runner import PrefillChunk  # noqa: E402
from testing import tiny_families  # noqa: E402

FAMILIES = [name for name in tiny_families.FAMILIES if name != "llama"]
# A checkpoint: "transformers" (the loaded model; with our kernels, or torch's operations only) or a
# GGUF file of that ggml type.
SOURCES = ["transformers", "transformers-torch", "F32", "F16", "Q8_0", "Q4_0"]
FLOAT_SOURCES = ("transformers", "transformers-torch", "F32", "F16")
PROMPTS = ([5, 17, 33, 2, 90], [3, 9, 27, 81, 44, 12, 60, 7, 71, 30, 19, 4])  # the longer passes Mistral's window


@pytest.fixture(autouse=True)
def float32_activations():
    """Our block products with float32 activations (an engine started earlier may have set 16 bits)."""
    kernels = cpu_kernels.load(None)
    if kernels is None:
        yield
        return
    bits = kernels.activation_bits
    kernels.set_activation_bits(32)
    yield
    kernels.set_activation_bits(bits)


def runner_and_reference(name: str, source: str, tmp_path, seed: int = 0):
    """Our runner of family ``name`` from ``source`` and transformers' model on the same weights."""
    model = tiny_families.tiny_family_model(name, seed)
    if source.startswith("transformers"):
        kernels = None if source == "transformers-torch" else "auto"
        return LlamaModelRunner(model, max_batch_size=2, kernels=kernels), model
    kind = getattr(ggml, source)
    if kind != ggml.F32 and cpu_kernels.load(None) is None:
        pytest.skip("our CPU kernels cannot run here")
    architecture = tiny_families.architecture(name)
    path = tmp_path / f"{name}.gguf"
    stored = tiny_families.write_gguf(model, path, kind, architecture=architecture)
    reference = tiny_families.stored_reference(model, stored, architecture=architecture)
    file = GGUFFile(path)
    weights = family.gguf_weights(file, family.config_from_gguf(file), torch.float32)
    return LlamaModelRunner(weights, max_batch_size=2), reference


def greedy_batch(runner, prompts, steps: int) -> tuple[list[list[int]], list[dict[int, torch.Tensor]]]:
    """Prefill ``prompts`` in one pass, then ``steps`` greedy decode steps of both rows; returns each
    sequence's tokens and our logits by position (the prediction of the position after it)."""
    chunks = [PrefillChunk(key, ids, 0, True) for key, ids in enumerate(prompts)]
    sequences = [list(ids) for ids in prompts]
    logits = [dict(enumerate(rows)) for rows in runner.prefill(chunks)]
    for key in range(len(prompts)):
        runner.join(key, 1)
    for _ in range(steps):
        tokens = [int(seq_logits[len(seq) - 1].argmax()) for seq, seq_logits in zip(sequences, logits)]
        rows = runner.decode(tokens)
        for seq, seq_logits, token, row in zip(sequences, logits, tokens, rows):
            seq.append(token)
            seq_logits[len(seq) - 1] = row
    return sequences, logits


def reference_greedy(model, prompt: list[int], tokens: int) -> list[int]:
    """transformers' greedy continuation of ``prompt`` by ``tokens`` tokens (a whole pass each step)."""
    ids = list(prompt)
    for _ in range(tokens):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", FAMILIES)
def test_prefill_and_decode_logits_equal_transformers(name, source, tmp_path):
    runner, reference = runner_and_reference(name, source, tmp_path)
    tolerance = 1e-4 if source in FLOAT_SOURCES else 2e-3
    with torch.inference_mode():
        sequences, logits = greedy_batch(runner, PROMPTS, steps=4)
        for seq, seq_logits in zip(sequences, logits):
            expected = reference(input_ids=torch.tensor([seq])).logits[0]
            got = torch.stack([seq_logits[position] for position in range(len(seq))])
            assert (got - expected).abs().max() <= tolerance * expected.abs().max()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_text_equals_transformers_over_32_tokens(name, source, tmp_path):
    runner, reference = runner_and_reference(name, source, tmp_path, seed=1)
    with torch.inference_mode():
        sequences, logits = greedy_batch(runner, PROMPTS, steps=31)  # the 32nd token from the last logits
        got = [seq + [int(seq_logits[len(seq) - 1].argmax())] for seq, seq_logits in zip(sequences, logits)]
        expected = [reference_greedy(reference, prompt, 32) for prompt in PROMPTS]
    assert got == expected


@pytest.mark.parametrize("source", ["transformers", "F32"])
def test_longrope_serves_the_context_of_its_short_factors_and_refuses_past_it(source, tmp_path):
    # Longrope's frequencies change past original_max_position_embeddings for the whole sequence
    # (transformers' rule), which a cache of rotated keys cannot follow: the runner serves up to it.
    runner, _ = runner_and_reference("phi3-longrope", source, tmp_path)
    assert runner.max_context == 64 and runner._rope_scaling > 1.0  # sqrt(1 + ln 4 / ln 64)
    with torch.inference_mode():
        runner.prefill([PrefillChunk(0, list(range(64)), 0, False)])
        with pytest.raises(ValueError, match="past the model's context of 64"):
            runner.prefill([PrefillChunk(1, list(range(65)), 0, False)])


# --- which runner serves a model ---------------------------------------------------------------------


def test_a_family_we_run_is_served_by_our_runner_and_says_so(caplog):
    from inference.model_runner import build_runner

    model = tiny_families.tiny_family_model("qwen3")
    with caplog.at_level("INFO", logger="inference.model_runner"):
        runner = build_runner(model, prefix_caching="off")
    assert isinstance(runner, LlamaModelRunner)
    assert runner.serving == {"name": "llama", "reason": "model_type qwen3: the qwen3 family"}
    assert "Runner: llama (model_type qwen3: the qwen3 family)" in caplog.text


def test_a_shape_we_do_not_run_stays_on_transformers_modeling_with_the_reason(caplog):
    from inference.model_runner import HFModelRunner, build_runner

    # Phi-4-mini's shape: Phi-3's layers with rotary embeddings on 3/4 of each head only.
    model = tiny_families.tiny_family_model(
        "phi3",
        sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
    )
    with caplog.at_level("INFO", logger="inference.model_runner"):
        runner = build_runner(model)
    assert isinstance(runner, HFModelRunner)
    assert runner.serving == {"name": "transformers", "reason": "our runner does not run it: partial rotary embeddings"}
    assert "Runner: transformers (our runner does not run it: partial rotary embeddings)" in caplog.text
    with torch.inference_mode():
        (got,) = runner.prefill([PrefillChunk(0, PROMPTS[1], 0, True)])
        expected = model(input_ids=torch.tensor([PROMPTS[1]])).logits[0]
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_engine_runner_transformers_is_the_reason_given_when_asked_for():
    from inference.model_runner import build_runner

    runner = build_runner(tiny_families.tiny_family_model("qwen2"), "transformers")
    assert runner.serving == {"name": "transformers", "reason": "ENGINE_RUNNER=transformers"}


def test_a_gguf_with_partial_rotary_embeddings_is_refused_naming_them(tmp_path):
    from inference.formats.gguf import ModelFileError

    path = tmp_path / "phi4-mini.gguf"
    tiny_families.write_gguf(
        tiny_families.tiny_family_model("phi3"), path, ggml.F32, architecture="phi3", corrupt="partial_rope"
    )
    with pytest.raises(ModelFileError, match="rotary embeddings on 72 of each head's 96 dimensions"):
        family.config_from_gguf(GGUFFile(path))


# Q4_K rows are whole blocks of 256: each family's layers at a hidden size of 256 and an MLP of 512.
Q4_K_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize("name", [name for name in FAMILIES if name != "phi3-longrope"])  # its factors fit 96
def test_a_q4_k_file_gives_transformers_logits_on_its_blocks(name, tmp_path):
    # Q4_K_M files hold Q4_K (and Q6_K) blocks; gguf-py cannot quantize to Q4_K, so random blocks.
    if cpu_kernels.load(None) is None:
        pytest.skip("our CPU kernels cannot run here")
    model = tiny_families.tiny_family_model(name, **Q4_K_SHAPE, head_dim=64)
    architecture = tiny_families.architecture(name)
    stored = tiny_families.write_gguf(model, tmp_path / "q4_k.gguf", ggml.Q4_K, architecture=architecture)
    reference = tiny_families.stored_reference(model, stored, architecture=architecture)
    file = GGUFFile(tmp_path / "q4_k.gguf")
    runner = LlamaModelRunner(family.gguf_weights(file, family.config_from_gguf(file), torch.float32), max_batch_size=2)
    assert "Q4_K x" in runner.description
    with torch.inference_mode():
        sequences, logits = greedy_batch(runner, PROMPTS, steps=4)
        for seq, seq_logits in zip(sequences, logits):
            expected = reference(input_ids=torch.tensor([seq])).logits[0]
            got = torch.stack([seq_logits[position] for position in range(len(seq))])
            assert (got - expected).abs().max() <= 2e-3 * expected.abs().max()


@pytest.fixture
def eight_bit_k_quants(kernel_choices):
    """The engine's default products: the K-quants' x rounded to 8 bits, so that Q4_K loads interleaved
    (on AVX-512 VNNI's code, the engine's choice where the CPU has it)."""
    if not kernel_choices.k_quant_int8_available or not (kernel_choices.avx512 and kernel_choices.vnni):
        pytest.skip("no 8-bit K-quant products on AVX-512 VNNI here: Q4_K loads as stored")
    kernel_choices.set_activation_bits(16)
    kernel_choices.set_k_quant_int8(True)


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma2"])
def test_a_q4_k_file_loads_interleaved_with_the_stored_blocks_logits(name, tmp_path, eight_bit_k_quants, monkeypatch):
    # Under 8-bit K-quant products Q4_K layers are copies interleaved by 8 rows, in the one-call
    # decode step too, and compute what the blocks as stored compute (the same integer sums).
    model = tiny_families.tiny_family_model(name, **Q4_K_SHAPE, head_dim=64)
    architecture = tiny_families.architecture(name)
    tiny_families.write_gguf(model, tmp_path / "q4_k.gguf", ggml.Q4_K, architecture=architecture)

    def load() -> LlamaModelRunner:
        file = GGUFFile(tmp_path / "q4_k.gguf")
        return LlamaModelRunner(
            family.gguf_weights(file, family.config_from_gguf(file), torch.float32), max_batch_size=2
        )

    interleaved = load()
    kinds = {part[2] for linear in interleaved._layers[0].products for part in linear.step_parts(1) or []}
    assert kinds == {ggml.Q4_K_X8} and interleaved._whole_step_table(2) is not None
    monkeypatch.setattr(ggml, "interleaves", lambda kind, rows: False)
    stored = load()
    assert {part[2] for linear in stored._layers[0].products for part in linear.step_parts(1) or []} == {ggml.Q4_K}
    with torch.inference_mode():
        got = greedy_batch(interleaved, PROMPTS, steps=4)
        expected = greedy_batch(stored, PROMPTS, steps=4)
    assert got[0] == expected[0]
    for ours, theirs in zip(got[1], expected[1]):
        for position, logits in theirs.items():
            assert (ours[position] - logits).abs().max() <= 1e-4 * logits.abs().max()


@pytest.mark.parametrize("source", ["Q4_K", "Q8_0"])
@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma2"])
def test_one_kernel_call_per_step_runs_each_familys_layer_as_the_per_operation_step(
    name, source, tmp_path, monkeypatch
):
    """A Qwen or Gemma 2 file's decode step is one call of our kernels (CPUKernels.decode_layers), with
    Qwen's q/k/v bias and per-head q/k norms, Gemma 2's output norms, GeGLU, attention scale and
    soft-capped scores inside it: the per-operation step's logits within float32 rounding."""
    if cpu_kernels.load(None) is None:
        pytest.skip("our CPU kernels cannot run here")
    model = tiny_families.tiny_family_model(name, **Q4_K_SHAPE, head_dim=64)
    architecture = tiny_families.architecture(name)
    kind = getattr(ggml, source)
    tiny_families.write_gguf(model, tmp_path / "model.gguf", kind, architecture=architecture)
    file = GGUFFile(tmp_path / "model.gguf")
    whole, per_operation = (
        LlamaModelRunner(family.gguf_weights(file, family.config_from_gguf(file), torch.float32), max_batch_size=2)
        for _ in "ab"
    )
    per_operation._whole_step_table = lambda rows: None
    calls = []
    one_call = cpu_kernels.CPUKernels.decode_layers
    monkeypatch.setattr(
        cpu_kernels.CPUKernels, "decode_layers", lambda *args, **kw: calls.append(1) or one_call(*args, **kw)
    )
    with torch.inference_mode():
        for runner in (whole, per_operation):
            runner.prefill(
                [PrefillChunk(key, ids[:3], 0, False) for key, ids in enumerate(PROMPTS)]
            )  # within Gemma 2's window of 6
            runner.join(0, 1)
            runner.join(1, 1)
        table = whole._whole_step_table(2)
        field = {"qwen2": 4, "qwen3": 2, "gemma2": 8}[name]  # the bias, the q/k norms, the output norms
        assert table is not None and bool(table[:, field].all())
        for tokens in ([4, 8], [15, 16], [23, 42]):
            expected = per_operation.decode(tokens)
            assert (whole.decode(tokens) - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert len(calls) == 3  # every step of `whole` was the one call
