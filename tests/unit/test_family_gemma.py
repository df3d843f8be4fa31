"""Gemma 2 and Gemma 3 on the shared runner: a tiny random model of each family's real config shape
(:mod:`testing.tiny_families`), from a transformers model and from a GGUF file as llama.cpp's
converter writes it, gives transformers' logits (prefill and decode steps, two sequences of
different lengths, past the tiny sliding window) and transformers' greedy text."""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf")

from inference import cpu_kernels  # noqa: E402
from inference.families import llama as family  # noqa: E402
from inference.families.family import layer_windows  # noqa: E402
from inference.formats import ggml  # noqa: E402
from inference.formats.gguf import GGUFFile  # noqa: E402
from inference.llama import LlamaModelRunner  # noqa: E402
from inference.model_runner import PrefillChunk  # noqa: E402
from testing import tiny_families  # noqa: E402

FAMILIES = ["gemma2", "gemma3"]
# Two prompts of different lengths: within the tiny window of 6 (our kernels' paths where they
# apply), and past it (every local layer's window cuts).
PROMPTS = {
    "within_window": ([5, 17, 33], [2, 90, 41, 8, 77]),
    "past_window": ([5, 17, 33, 2, 90, 41, 8, 61, 12], [3, 9, 27, 81]),
}
FED = [[44, 6, 19, 70, 11, 58], [23, 88, 4, 35, 67, 14]]  # the tokens each row's decode steps take
FORMATS = [ggml.F32, ggml.F16, ggml.Q8_0, ggml.Q4_0]
FLOAT_TOLERANCE = 1e-4  # relative to the largest logit: float32 rounding
BLOCK_TOLERANCE = 2e-3  # block formats: our products may round x to 16 bits per group


def _needs_kernels() -> None:
    if cpu_kernels.load(None) is None:
        pytest.skip(f"our CPU kernels cannot run here: {cpu_kernels.unavailable_reason()}")


def _runner_logits(runner: LlamaModelRunner, prompts, fed) -> list[torch.Tensor]:
    """Per row, the runner's logits ``[len(prompt) + len(fed), vocab]``: every prompt position's,
    then each decode step's, prompts prefilled together and decoded as one batch."""
    with torch.inference_mode():
        prefilled = runner.prefill([PrefillChunk(key, list(ids), 0, True) for key, ids in enumerate(prompts)])
        for key in range(len(prompts)):
            runner.join(key, 1)
        steps = [runner.decode([row[step] for row in fed]) for step in range(len(fed[0]))]
    return [torch.cat([prefilled[row], *[step[row : row + 1] for step in steps]]) for row in range(len(prompts))]


def _reference_logits(model, prompts, fed) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(torch.tensor([list(ids) + row])).logits[0] for ids, row in zip(prompts, fed)]


def _assert_close(got: list[torch.Tensor], expected: list[torch.Tensor], tolerance: float) -> None:
    for row, (ours, theirs) in enumerate(zip(got, expected)):
        assert ours.shape == theirs.shape
        error = ((ours - theirs).abs().max() / theirs.abs().max()).item()
        assert error <= tolerance, f"row {row}: relative error {error:.2e}"


def _greedy(runner: LlamaModelRunner, prompt: list[int], tokens: int) -> list[int]:
    with torch.inference_mode():
        runner.reset()
        token = int(runner.prefill([PrefillChunk(0, prompt, 0, False)])[0][-1].argmax())
        runner.join(0, 1)
        out = [token]
        while len(out) < tokens:
            token = int(runner.decode([token])[0].argmax())
            out.append(token)
    return out


def _reference_greedy(model, prompt: list[int], tokens: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("prompts", PROMPTS.values(), ids=PROMPTS.keys())
@pytest.mark.parametrize("kernels", ["auto", None], ids=["our_kernels", "torch"])
@pytest.mark.parametrize("name", FAMILIES)
def test_a_transformers_gemma_gives_its_logits_on_our_runner(tmp_path, name, kernels, prompts):
    if kernels:
        _needs_kernels()
    model = tiny_families.tiny_family_model(name)
    runner = LlamaModelRunner(model, max_batch_size=2, kernels=kernels)
    _assert_close(_runner_logits(runner, prompts, FED), _reference_logits(model, prompts, FED), FLOAT_TOLERANCE)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_transformers_gemma_gives_its_greedy_text(tmp_path, name):
    model = tiny_families.tiny_family_model(name, seed=1)
    runner = LlamaModelRunner(model, max_batch_size=1)
    prompt = [7, 21, 3, 64, 30]
    assert _greedy(runner, prompt, 32) == _reference_greedy(model, prompt, 32)


@pytest.mark.parametrize("name", FAMILIES)
def test_an_attention_scale_other_than_the_head_size_is_the_models(name):
    # The 27B models scale scores by (hidden / heads) ** -0.5, not head_dim ** -0.5.
    model = tiny_families.tiny_family_model(name, query_pre_attn_scalar=72)
    runner = LlamaModelRunner(model, max_batch_size=2, kernels=None)
    prompts = PROMPTS["past_window"]
    _assert_close(_runner_logits(runner, prompts, FED), _reference_logits(model, prompts, FED), FLOAT_TOLERANCE)


@pytest.mark.parametrize("kind", FORMATS, ids=[ggml.type_name(kind) for kind in FORMATS])
@pytest.mark.parametrize("name", FAMILIES)
def test_a_gguf_gemma_gives_transformers_logits_on_its_stored_weights(tmp_path, name, kind):
    _needs_kernels()
    model = tiny_families.tiny_family_model(name)
    stored = tiny_families.write_gguf(model, tmp_path / "tiny.gguf", kind, architecture=name)
    reference = tiny_families.stored_reference(model, stored, architecture=name)
    file = GGUFFile(tmp_path / "tiny.gguf")
    config = family.config_from_gguf(file)
    assert config.layer_types == model.config.layer_types
    try:
        weights = family.gguf_weights(file, config, torch.float32)
    except NotImplementedError as error:
        pytest.skip(str(error))
    tolerance = FLOAT_TOLERANCE if kind in (ggml.F32, ggml.F16) else BLOCK_TOLERANCE
    for prompts in PROMPTS.values():
        runner = LlamaModelRunner(weights, max_batch_size=2)
        got = _runner_logits(runner, prompts, FED)
        _assert_close(got, _reference_logits(reference, prompts, FED), tolerance)
    prompt = [7, 21, 3, 64, 30]
    assert _greedy(runner, prompt, 32) == _reference_greedy(reference, prompt, 32)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_gguf_gemma_reads_its_family_settings_from_the_metadata(tmp_path, name):
    model = tiny_families.tiny_family_model(name)
    tiny_families.write_gguf(model, tmp_path / "tiny.gguf", ggml.F32, architecture=name)
    config = family.config_from_gguf(GGUFFile(tmp_path / "tiny.gguf"))
    expected = model.config
    assert type(config) is type(expected)
    for key in ("sliding_window", "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping"):
        assert getattr(config, key) == getattr(expected, key), key
    assert config.rope_parameters == expected.rope_parameters


def test_a_gguf_gemma2_without_its_soft_caps_gets_llama_cpps(tmp_path):
    model = tiny_families.tiny_family_model("gemma2")
    tiny_families.write_gguf(model, tmp_path / "tiny.gguf", ggml.F32, architecture="gemma2", corrupt="no_softcaps")
    config = family.config_from_gguf(GGUFFile(tmp_path / "tiny.gguf"))

    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)


def test_a_gguf_gemma3_without_a_sliding_window_has_no_local_layer(tmp_path):
    model = tiny_families.tiny_family_model("gemma3")
    path = tmp_path / "tiny.gguf"
    tiny_families.write_gguf(model, path, ggml.F32, architecture="gemma3", corrupt="no_sliding_window")
    config = family.config_from_gguf(GGUFFile(path))

    assert layer_windows(config) == [None] * config.num_hidden_layers
    assert family.layer_ropes(config) == [None] * config.num_hidden_layers  # the global rope everywhere


def test_a_gguf_gemma3_takes_its_local_rope_base_from_the_file(tmp_path, monkeypatch):
    model = tiny_families.tiny_family_model("gemma3")
    path = tmp_path / "tiny.gguf"
    global_base = gguf.GGUFWriter.add_rope_freq_base

    def add_rope_freq_base(writer, value):  # newer converters write the local base beside the global one
        global_base(writer, value)
        writer.add_rope_freq_base_swa(5e4)

    monkeypatch.setattr(gguf.GGUFWriter, "add_rope_freq_base", add_rope_freq_base)
    tiny_families.write_gguf(model, path, ggml.F32, architecture="gemma3")
    config = family.config_from_gguf(GGUFFile(path))

    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 5e4


# --- the chat template and the stop token of a GGUF file ------------------------------------------

# Conversations and what Gemma 3's template makes of them (transformers' apply_chat_template with
# Google's template): no system turn, its text at the head of the first user turn; "model" turns.
CONVERSATIONS = [
    ([{"role": "user", "content": "Hi"}], "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"),
    (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n",
    ),
    (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "hello there"},
            {"role": "user", "content": " How are you? "},
        ],
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nhello there<end_of_turn>\n"
        "<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n",
    ),
]


@pytest.fixture(scope="module")
def gemma_engine(tmp_path_factory):
    """An engine serving a tiny Gemma 3 GGUF file with Gemma's tokenizer and chat template."""
    from inference.engine import Engine, EngineConfig
    from inference.model_loader import ModelConfig

    _needs_kernels()
    folder = tmp_path_factory.mktemp("gemma")
    model = tiny_families.tiny_family_model("gemma3")
    path = folder / "tiny-gemma.gguf"
    tiny_families.write_gguf(
        model, path, ggml.Q8_0, architecture="gemma3", chat_template=tiny_families.GEMMA3_CHAT_TEMPLATE
    )
    # MODEL_PATH naming the file: the engine loads it as a server does (the default cache: our
    # kernels built once there).
    engine = Engine(ModelConfig(path=str(path), model_id="tiny-gemma", device="cpu"), EngineConfig(max_batch_size=2))
    engine.start()
    assert engine.wait_ready(120), engine.load_error
    yield engine
    engine.stop()


@pytest.mark.parametrize("messages, text", CONVERSATIONS)
def test_a_gguf_gemmas_chat_prompt_is_its_templates_turns(gemma_engine, messages, text):
    ids = gemma_engine.chat_prompt_ids(messages)

    assert gemma_engine.tokenizer.decode(ids) == text
    assert ids == gemma_engine.tokenizer.encode(text, add_special_tokens=False)
    assert ids[:2] == [2, tiny_families.GEMMA_TOKENS.index("<start_of_turn>")]  # bos, then one token each


def test_gemmas_template_refuses_roles_that_do_not_alternate(gemma_engine):
    from inference.outputs import ChatTemplateError

    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        gemma_engine.chat_prompt_ids([{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi"}])


def test_end_of_turn_ends_a_gemma_generation(gemma_engine):
    import asyncio

    from inference.sampling import SamplingParams

    end_of_turn = tiny_families.GEMMA_TOKENS.index("<end_of_turn>")
    assert end_of_turn in gemma_engine.eos_token_ids
    params = SamplingParams(max_tokens=8, temperature=0.0, logit_bias={end_of_turn: 100.0})

    async def run():
        outputs = []
        async for output in gemma_engine.submit("r", gemma_engine.chat_prompt_ids(CONVERSATIONS[0][0]), params):
            outputs.extend(output.outputs)
        return outputs

    outputs = asyncio.run(run())
    assert outputs[-1].finish_reason == "stop"
    assert sum(len(output.token_ids) for output in outputs) <= 1  # the stop token only, never past it
    assert "".join(output.text for output in outputs) == ""
