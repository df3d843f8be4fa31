"""LlamaModelRunner computes the logits transformers computes, through every move of the running batch.

The reference is transformers' own forward pass over each sequence's whole history, alone and
without a cache: the runner's logits for a position (from a prefill chunk or a decode step, whatever
the batch around it) must equal the reference's at that position.

In float64 they agree up to the rounding of the returned logits to float32, which shows the
computation is the same (transformers' RMSNorm rounds to float32 even in a float64 model, so the
float64 reference computes it in float64).  In float32 the fused
products and attention sum in another order than transformers' modules do, and float32 cannot
promise more than transformers promises itself: its own logits for the same tokens differ by up to
1.1e-5 (tiny model, logits up to 9) and 4.4e-5 (embedded model, logits up to 34) between its sdpa
and eager attention or between a 47- and a 48-token pass.  The float32 bounds are set just above
those figures: 3e-5 and 1e-4.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from inference import cpu_kernels
from inference.llama import LlamaModelRunner, supports, unsupported_reason
from inference.model_runner import PrefillChunk
from testing.tiny_model import tiny_model

VOCAB = 70


class Sequence:
    """A request as the test drives it: its tokens so far and the runner's logits by position."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = list(token_ids)
        self.logits: dict[int, torch.Tensor] = {}  # position -> [vocab] predicting position + 1

    def record(self, first_position: int, logits: torch.Tensor) -> None:
        for offset, row in enumerate(logits):
            self.logits[first_position + offset] = row


def rms_norm_in_input_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm without its rounding to float32 (a float64 reference must stay float64)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def assert_matches_transformers(model, sequences: list[Sequence], tolerance: tuple[float, float]) -> None:
    """Every recorded logit row equals transformers' for its sequence's history within ``tolerance``."""
    exact = model.dtype == torch.float64
    with (
        torch.inference_mode(),
        patch.object(LlamaRMSNorm, "forward", rms_norm_in_input_dtype) if exact else nullcontext(),
    ):
        for seq in sequences:
            reference = model(input_ids=torch.tensor([seq.token_ids])).logits[0]
            positions = sorted(seq.logits)
            got = torch.stack([seq.logits[p] for p in positions]).to(reference.dtype)
            torch.testing.assert_close(got, reference[positions], atol=tolerance[0], rtol=tolerance[1])


def prefill(runner, seq: Sequence, key: int, chunk_sizes: list[int], all_logits: bool = True) -> None:
    """Prefill ``seq``'s tokens in chunks of these sizes, one pass per chunk, recording the logits."""
    start = 0
    for size in chunk_sizes:
        ids = seq.token_ids[start : start + size]
        (logits,) = runner.prefill([PrefillChunk(key, ids, start, all_logits)])
        seq.record(start if all_logits else start + size - 1, logits)
        start += size
    assert start == len(seq.token_ids)


def decode(runner, rows: list[Sequence], generator: torch.Generator) -> None:
    """One decode step with random next tokens (any token will do: the reference reads the same)."""
    tokens = torch.randint(0, VOCAB, (len(rows),), generator=generator).tolist()
    logits = runner.decode(tokens)
    assert logits.shape == (len(rows), runner.vocab_size) and logits.dtype == torch.float32
    for seq, token, row in zip(rows, tokens, logits):
        seq.token_ids.append(token)
        seq.record(len(seq.token_ids) - 1, row[None])


def random_ids(generator: torch.Generator, size: int, vocab: int = VOCAB) -> list[int]:
    return torch.randint(0, vocab, (size,), generator=generator).tolist()


# (atol, rtol).  Float64: the same computation, up to the rounding of the returned logits to
# float32 (a relative 2**-24).  Float32: just above transformers' own disagreement with itself; for
# the embedded model (logits up to about 20) 2e-4: on the AVX2 code (ATEN_CPU_CAPABILITY=avx2, as on
# a Zen 3) 13 of 442,368 logits differed by up to 1.27e-4, on the AVX-512 code by less than 1e-4.
EXACT = (1e-10, 2**-24)
FLOAT32 = {"tiny": (3e-5, 0.0), "embedded": (2e-4, 0.0)}
BFLOAT16 = (1.5, 0.0)
FLOAT16_KV = (0.1, 0.0)  # float16 keys and values (11 significant bits), logits up to 9: measured 0.034


@pytest.fixture(scope="module")
def tiny():
    """The tiny random Llama in float64, where the runner must agree with transformers exactly."""
    return tiny_model(vocab_size=VOCAB).double()


@pytest.fixture(scope="module")
def tiny32():
    return tiny_model(vocab_size=VOCAB)


def run_scenario(model, runner, vocab: int, tolerance: tuple[float, float]) -> None:
    """Chunks, batched prefill, copies, rows of different lengths leaving and joining mid-way."""
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        long = Sequence(random_ids(generator, 40, vocab))
        prefill(runner, long, key=1, chunk_sizes=[16, 16, 8])  # a multi-chunk prefill, every position
        short, medium = Sequence(random_ids(generator, 5, vocab)), Sequence(random_ids(generator, 23, vocab))
        logits = runner.prefill(
            [PrefillChunk(2, short.token_ids, 0, False), PrefillChunk(3, medium.token_ids, 0, True)]
        )
        short.record(4, logits[0])
        medium.record(0, logits[1])
        runner.join(1, 1)
        runner.join(2, 2)  # two candidates sharing one prefill
        forked = Sequence(short.token_ids)
        rows = [long, short, forked]
        for _ in range(3):
            decode(runner, rows, generator)
        runner.join(3, 1)
        rows.append(medium)
        for _ in range(2):
            decode(runner, rows, generator)
        runner.keep([0, 3, 2])  # the short row leaves; the last row takes its place
        rows = [rows[0], rows[3], rows[2]]
        decode(runner, rows, generator)
        late = Sequence(random_ids(generator, 11, vocab))
        prefill(runner, late, key=4, chunk_sizes=[6, 5], all_logits=False)
        runner.join(4, 1)
        rows.append(late)
        for _ in range(3):
            decode(runner, rows, generator)
        runner.keep([3, 1])  # reordered
        rows = [rows[3], rows[1]]
        decode(runner, rows, generator)
    assert runner.lengths == [len(seq.token_ids) for seq in rows]
    assert_matches_transformers(model, [long, short, forked, medium, late], tolerance)


def test_tiny_llama_logits_equal_transformers_through_the_batch_lifecycle(tiny):
    run_scenario(tiny, LlamaModelRunner(tiny, dtype=torch.float64, max_batch_size=4), VOCAB, EXACT)


@pytest.mark.parametrize("fused", [True, False], ids=["our decode kernels", "torch's operations"])
def test_tiny_llama_in_float32_within_transformers_own_float32_noise(tiny32, fused):
    if fused and cpu_kernels.load(None) is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    runner = LlamaModelRunner(tiny32, kernels="auto" if fused else None)
    assert ("fused decode ops" in runner.description) == fused
    run_scenario(tiny32, runner, VOCAB, FLOAT32["tiny"])


@pytest.mark.parametrize("fused", [True, False], ids=["our decode kernels", "torch's operations"])
def test_tiny_llama_with_a_float16_kv_cache_stays_near_float32(tiny32, fused):
    """float32 activations over a float16 KV cache (ENGINE_KV_CACHE_DTYPE=auto where our kernels
    run): prefill's writes, the kernels' and torch's decode writes and every read agree; the
    logits stay within float16's rounding of the keys and values (FLOAT16_KV: 3 times what was measured,
    the same with our kernels and torch's operations)."""
    if fused and cpu_kernels.load(None) is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    runner = LlamaModelRunner(tiny32, kernels="auto" if fused else None, kv_cache_dtype=torch.float16)
    assert "float16 KV cache" in runner.description
    run_scenario(tiny32, runner, VOCAB, FLOAT16_KV)
    assert all(t.dtype == torch.float16 for t in runner._layer_keys + runner._layer_values)


@pytest.mark.parametrize("kv_cache_dtype", [torch.float32, torch.float16])
def test_a_head_size_of_64_runs_the_prefill_attention_kernel_within_transformers_noise(kv_cache_dtype):
    """Heads of 64 (the embedded model's) take CPUKernels.prefill_attention in every prefill pass
    (the other tiny model's heads of 16 take torch's operations): through the whole scenario the
    logits stay within float32's noise (measured 3.6e-5 at most, logits up to 8; 3.2e-5 with torch's
    prefill attention beside our other kernels, 2.0e-5 with torch's operations alone), or float16's
    rounding of the keys and values (0.024 on every path)."""
    if cpu_kernels.load(None) is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    runner = LlamaModelRunner(model, kernels="auto", kv_cache_dtype=kv_cache_dtype)
    assert runner._prefill_attention_fits()
    kernel_call = cpu_kernels.CPUKernels.prefill_attention
    with patch.object(cpu_kernels.CPUKernels, "prefill_attention", autospec=True, side_effect=kernel_call) as kernel:
        run_scenario(model, runner, VOCAB, (5e-5, 0.0) if kv_cache_dtype == torch.float32 else FLOAT16_KV)
    assert kernel.call_count == 6 * config.num_hidden_layers  # six prefill passes, one call per layer


def test_tiny_llama_in_bfloat16_stays_near_float32(tiny32):
    """bfloat16 activations, KV cache and weights (oneDNN-packed where the CPU has bf16): a smoke
    test of that wiring, not of its accuracy (8 significant bits, logits up to 9; measured 0.7 off
    at most; a wrong layout would be off by the logits' size)."""
    run_scenario(tiny32, LlamaModelRunner(tiny32, dtype=torch.bfloat16), VOCAB, BFLOAT16)


def test_continued_chunk_and_new_prompt_prefill_together(tiny):
    generator = torch.Generator().manual_seed(2)
    runner = LlamaModelRunner(tiny, dtype=torch.float64)
    first, second = Sequence(random_ids(generator, 30)), Sequence(random_ids(generator, 9))
    with torch.inference_mode():
        (head,) = runner.prefill([PrefillChunk(1, first.token_ids[:12], 0, True)])
        first.record(0, head)
        rest, new = runner.prefill(
            [PrefillChunk(1, first.token_ids[12:], 12, True), PrefillChunk(2, second.token_ids, 0, True)]
        )
        first.record(12, rest)
        second.record(0, new)
    assert rest.shape == (18, VOCAB) and new.shape == (9, VOCAB)
    assert_matches_transformers(tiny, [first, second], EXACT)


def test_prefill_attends_in_blocks_of_queries_as_in_one_call(tiny):
    # Blocks of 4 queries (ATTENTION_QUERIES, 256 in the server): the scenario's chunks, one after a
    # cached prefix, and a group of new prompts of one size, exactly as transformers.
    generator = torch.Generator().manual_seed(3)
    with patch("inference.llama.ATTENTION_QUERIES", 4), torch.inference_mode():
        run_scenario(tiny, LlamaModelRunner(tiny, dtype=torch.float64, max_batch_size=4), VOCAB, EXACT)
        runner = LlamaModelRunner(tiny, dtype=torch.float64)
        group = [Sequence(random_ids(generator, 10)) for _ in range(2)]
        logits = runner.prefill([PrefillChunk(key, seq.token_ids, 0, True) for key, seq in enumerate(group)])
        for seq, rows in zip(group, logits):
            seq.record(0, rows)
    assert_matches_transformers(tiny, group, EXACT)


def test_the_cache_grows_past_its_first_capacity(tiny):
    """More rows and positions than the first allocation: the cache is copied while rows keep theirs."""
    generator = torch.Generator().manual_seed(3)
    runner = LlamaModelRunner(tiny, dtype=torch.float64)
    seqs = [Sequence(random_ids(generator, 60 + i % 10)) for i in range(34)]
    with torch.inference_mode():
        for key, seq in enumerate(seqs):
            prefill(runner, seq, key, [len(seq.token_ids)], all_logits=False)
            runner.join(key, 1)
        for _ in range(8):  # past 64 positions, in 34 rows (more than one chunk of rows)
            decode(runner, seqs, generator)
        layers, kv_heads, dim, item = 2, 2, 16, 8  # the tiny model's, in float64
        assert runner.cache_bytes == 2 * layers * 40 * kv_heads * 128 * dim * item  # 40 rows, 128 positions
        runner.keep(range(20))  # fills half of them: kept as they are
        assert runner.cache_bytes == 2 * layers * 40 * kv_heads * 128 * dim * item
        runner.keep([9])  # fills less than a quarter: shrinks them
        assert runner.cache_bytes == 2 * layers * 8 * kv_heads * 128 * dim * item
        decode(runner, seqs[9:10], generator)
    assert_matches_transformers(tiny, seqs, EXACT)


def test_the_cache_doubles_its_positions_as_a_sequence_grows(tiny):
    """Copies logarithmic in a sequence's length: past 128 positions the cache holds 256, not 192
    (the tiny model's whole context)."""
    generator = torch.Generator().manual_seed(5)
    runner = LlamaModelRunner(tiny, dtype=torch.float64)
    assert runner.max_context == 256
    seq = Sequence(random_ids(generator, 120))
    with torch.inference_mode():
        prefill(runner, seq, 0, [120], all_logits=False)
        runner.join(0, 1)
        layers, kv_heads, dim, item = 2, 2, 16, 8  # the tiny model's, in float64
        assert runner.cache_bytes == 2 * layers * 8 * kv_heads * 128 * dim * item  # 8 rows, 128 positions
        for _ in range(10):
            decode(runner, [seq], generator)
        assert runner.cache_bytes == 2 * layers * 8 * kv_heads * 256 * dim * item
    assert_matches_transformers(tiny, [seq], EXACT)


def test_an_emptied_batch_frees_its_cache_and_starts_again(tiny):
    generator = torch.Generator().manual_seed(4)
    runner = LlamaModelRunner(tiny, dtype=torch.float64)
    with torch.inference_mode():
        first = Sequence(random_ids(generator, 7))
        prefill(runner, first, 1, [7], all_logits=False)
        runner.join(1, 1)
        decode(runner, [first], generator)
        runner.keep([])
        assert runner.lengths == [] and runner.cache_bytes > 0  # kept for the next rows
        runner.free_batch()
        assert runner.cache_bytes == 0
        second = Sequence(random_ids(generator, 4))
        prefill(runner, second, 2, [4], all_logits=False)
        runner.join(2, 1)
        decode(runner, [second], generator)
    assert_matches_transformers(tiny, [first, second], EXACT)


def test_release_reset_and_errors(tiny):
    runner = LlamaModelRunner(tiny, dtype=torch.float64)
    with torch.inference_mode():
        runner.prefill([PrefillChunk(1, [3, 4, 5], 0, False)])
        with pytest.raises(ValueError):
            runner.prefill([PrefillChunk(1, [6], 2, False)])  # 3 positions are cached, not 2
        with pytest.raises(ValueError):
            runner.prefill([PrefillChunk(9, [6], 4, False)])  # nothing cached for key 9
        runner.release(1)
        runner.release(1)  # harmless
        with pytest.raises(KeyError):
            runner.join(1, 1)
        with pytest.raises(ValueError):
            runner.decode([1])  # no running rows
        runner.prefill([PrefillChunk(2, [3, 4], 0, False)])
        runner.join(2, 2)
        with pytest.raises(IndexError):
            runner.keep([2])
        with pytest.raises(ValueError):
            runner.prefill([PrefillChunk(3, list(range(300)), 0, False)])  # past max_position_embeddings
        runner.reset()
        assert runner.lengths == []
        assert runner.decode([]).shape == (0, VOCAB)


def test_warm_up_leaves_no_cache_behind(tiny):
    runner = LlamaModelRunner(tiny, dtype=torch.float64, max_batch_size=3)
    runner.warm_up()
    assert runner.lengths == [] and runner._partials == {}


def test_tied_embeddings_and_scaled_rope_match_transformers():
    """A tied output layer and llama3-scaled rotary frequencies (Llama 3.1's) are taken as transformers takes them."""
    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.3,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    model = LlamaForCausalLM(config).eval().double()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    run_scenario(model, LlamaModelRunner(model, dtype=torch.float64), VOCAB, EXACT)


def test_supports_plain_llama_only(tiny):
    assert supports(tiny)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        attention_bias=True,
    )
    assert "bias" in unsupported_reason(LlamaForCausalLM(config))
    with pytest.raises(ValueError):
        LlamaModelRunner(LlamaForCausalLM(config))


@pytest.fixture(scope="module")
def embedded():
    from inference.model_loader import converted_gguf_dir, embedded_gguf_path

    try:
        folder = converted_gguf_dir(embedded_gguf_path(), Path(".cache/models"))
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_embedded_model_logits_equal_transformers_through_the_batch_lifecycle(embedded):
    runner = LlamaModelRunner(embedded)  # with our decode kernels where they run (see the tiny model's test)
    run_scenario(embedded, runner, runner.vocab_size, FLOAT32["embedded"])


def test_every_linear_layer_comes_from_the_given_factory(tiny):
    """Another weight format plugs in through one factory: four products per layer and the output layer."""
    from inference.llama import make_linear

    shapes, names = [], []

    def factory(weight: torch.Tensor, dtype: torch.dtype, sources: tuple[str, ...]):
        shapes.append(tuple(weight.shape))
        names.append(sources)
        return make_linear(weight, dtype)

    factory.description = "counted float64"
    runner = LlamaModelRunner(tiny, dtype=torch.float64, linear_factory=factory)
    config = tiny.config
    qkv_rows = (config.num_attention_heads + 2 * config.num_key_value_heads) * runner.head_dim
    per_layer = [(qkv_rows, 64), (64, 64), (2 * config.intermediate_size, 64), (64, config.intermediate_size)]
    assert shapes == per_layer * config.num_hidden_layers + [(VOCAB, 64)]
    # Each is told which of the model's parameters it stacks (a weight format may look their source up).
    assert names[0] == tuple(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    assert names[2] == ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight")
    assert names[-1] == ("lm_head.weight",)
    parameters = dict(tiny.named_parameters())
    assert all(name in parameters for group in names[:-1] for name in group)
    assert "counted float64" in runner.description


@pytest.mark.parametrize("kv_cache_dtype", [torch.float32, torch.float16])
def test_one_kernel_call_per_step_computes_what_the_per_operation_step_does(tiny32, kv_cache_dtype):
    """With every layer's products Q4_1 at a row count, a decode step is one call of our kernels
    (CPUKernels.decode_layers): the same functions in the same order as the fused step's
    per-operation calls, so the same logits to the bit; at a row count planned otherwise, the
    per-operation step runs."""
    if cpu_kernels.load(None) is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    from inference.weights import Plan
    from inference.weights import make_linear as make_format

    plan = Plan(((2, "q4_1"), (None, "float32")))

    def factory(weight, dtype, names):
        return make_format(weight, None, plan)

    whole, per_operation = (
        LlamaModelRunner(tiny32, linear_factory=factory, kv_cache_dtype=kv_cache_dtype) for _ in "ab"
    )
    per_operation._whole_step_table = lambda rows: None
    generator = torch.Generator().manual_seed(3)
    prompt = random_ids(generator, 9)
    with torch.inference_mode():
        for runner in (whole, per_operation):
            runner.prefill([PrefillChunk(1, prompt, 0, False), PrefillChunk(2, prompt[:4], 0, False)])
            runner.join(1, 2)
        assert whole._whole_step_table(2) is not None and whole._whole_step_table(3) is None
        for step in range(6):
            if step == 3:  # a third row: the float32 plan, no whole-step call; then back to two rows
                for runner in (whole, per_operation):
                    runner.join(2, 1)
            if step == 5:
                for runner in (whole, per_operation):
                    runner.keep([2, 0])
            tokens = random_ids(generator, len(whole.lengths))
            assert torch.equal(whole.decode(tokens), per_operation.decode(tokens))


def test_a_tied_embedding_is_read_from_exact_q8_0_output_blocks_and_the_models_copy_dropped():
    """The embedded GGUF's tied embedding is Q8_0: the runner embeds tokens from its output layer's
    blocks (the same values), keeps no float32 copy, and an engine's build drops the model's; an
    inexact Q8_0 (a trained float weight) keeps the float32 embedding."""
    if cpu_kernels.load(None) is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    from inference.model_runner import build_runner
    from inference.weights import make_linear as make_format
    from inference.weights import quantize_q8_0

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, initializer_range=0.3,
    )  # fmt: skip
    torch.manual_seed(6)
    model = LlamaForCausalLM(config).eval()
    embedding = model.get_input_embeddings().weight
    original = embedding.detach().clone()

    def factory(weight, dtype, names):
        return make_format(weight, None, "q8_0" if names == ("lm_head.weight",) else "float32")

    assert not LlamaModelRunner(model, linear_factory=factory).embedding_is_own  # random floats: not Q8_0
    with torch.no_grad():
        q, d = quantize_q8_0(original)
        embedding.copy_((q.float().view(VOCAB, -1, 32) * d[..., None]).view(VOCAB, 64))  # Q8_0's values exactly
    runner = LlamaModelRunner(model, linear_factory=factory)
    assert runner.embedding_is_own
    ids = torch.tensor([0, 5, VOCAB - 1, 5])
    torch.testing.assert_close(
        runner._embed(ids), embedding[ids].detach(), rtol=0, atol=1e-6 * embedding.abs().max().item()
    )
    with torch.inference_mode():
        (logits,) = runner.prefill([PrefillChunk(1, [3, 1, 4, 1, 5], 0, False)])
        reference = model(input_ids=torch.tensor([[3, 1, 4, 1, 5]])).logits[0, -1]
    torch.testing.assert_close(logits[0], reference, rtol=0, atol=1e-3)  # q8_0 output: its own rounding

    built = build_runner(model, "llama", 4, weights="q8_0", drop_model_layers=True, kv_cache_dtype="auto")
    assert built.embedding_is_own and model.get_input_embeddings().weight.numel() == 0


def test_float32_weights_keep_a_float32_kv_cache_under_auto(tiny32):
    """The deterministic mode (MODEL_WEIGHTS=float32) stays float32 throughout: ``auto`` gives the
    float16 cache only to other weight formats (float16 rounding flipped a batched greedy token)."""
    if cpu_kernels.load(None) is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    from inference.model_runner import build_runner

    assert build_runner(tiny32, "llama", 2, weights="float32").kv_dtype == torch.float32
    assert build_runner(tiny32, "llama", 2, weights="q8_0").kv_dtype == torch.float16
    assert build_runner(tiny32, "llama", 2, weights="q8_0", kv_cache_dtype="float32").kv_dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weights", ["q4_1", "q8_0"])
def test_our_kernels_formats_under_half_precision_activations_add_into_the_residual_in_its_dtype(
    tiny32, dtype, weights
):
    """A runner computing in bfloat16 or float16 with q4_1 or q8_0 layers (``MODEL_DTYPE=bfloat16
    MODEL_WEIGHTS=q4_1``): the kernels add float32 only into a float32 residual; this residual is
    ``dtype``, and writing float32 into it overran the buffer (a heap corruption at warm-up). The
    logits follow the float32 runner's within the half precision's rounding."""
    if cpu_kernels.load(None) is None:
        pytest.skip(f"no CPU kernels here: {cpu_kernels.unavailable_reason()}")
    from inference.weights import make_linear as make_format

    def factory(weight, activation_dtype, names):
        return make_format(weight.float(), None, weights)

    half = LlamaModelRunner(tiny32, dtype=dtype, linear_factory=factory)
    full = LlamaModelRunner(tiny32, dtype=torch.float32, linear_factory=factory)
    prompt = random_ids(torch.Generator().manual_seed(5), 70)  # 70 rows: the dense path too, then 1 row
    with torch.inference_mode():
        for runner in (half, full):
            (logits,) = runner.prefill([PrefillChunk(1, prompt[:9], 0, False)])
            runner.prefill([PrefillChunk(2, prompt, 0, False)])
            runner.join(1, 1)
            runner.join(2, 1)
            runner.logits = (logits, runner.decode([3, 4]))
    for got, expected in zip(half.logits, full.logits):
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        # bfloat16 keeps 8 bits of mantissa: within 10% of the logits' range (measured up to 4.5%).
        assert (got - expected).abs().max() <= 0.1 * expected.abs().max(), (
            (got - expected).abs().max(),
            expected.abs().max(),
        )
