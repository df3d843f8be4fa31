"""Each family served from a tiny GGUF file (Q8_0 blocks, its tokenizer and chat template in its
metadata, :mod:`testing.tiny_families`) through the real views: both endpoints answer, the chat
endpoint renders the file's template as transformers' ``apply_chat_template`` does, and the
family's stop tokens end a stream."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gguf")

from inference.engine import Engine, EngineConfig
from inference.formats import ggml
from inference.model_loader import ModelConfig
from testing import tiny_families
from tests.conftest import serve
from tests.inprocess_api import MODEL, get, post

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
FAMILIES = list(tiny_families.STOP_TOKENS)
CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Say bye."},
    ],
]


@pytest.fixture(scope="module", params=FAMILIES)
def family_engine(request, tmp_path_factory):
    """The engine serving family ``request.param``'s tiny GGUF file, as ``MODEL_PATH`` would."""
    name = request.param
    model = tiny_families.tiny_family_model(name, vocab_size=len(tiny_families.vocabulary(name)))
    path = tmp_path_factory.mktemp(name) / f"{name}.gguf"
    tiny_families.write_gguf(model, path, ggml.Q8_0, architecture=tiny_families.architecture(name), tokenizer=name)
    # The worktree's cache: our kernels are built there once, not per test.
    engine = Engine(ModelConfig(path=str(path), model_id=MODEL, cache_dir=Path(".cache/models")), EngineConfig())
    engine.start()
    assert engine.wait_ready(300)
    engine.family, engine.gguf_path = name, path
    yield engine
    engine.stop()


@pytest.fixture
def family_api(family_engine, monkeypatch):
    serve(monkeypatch, family_engine)
    return family_engine


def stop_ids(engine) -> dict[str, int]:
    vocabulary = tiny_families.vocabulary(engine.family)
    return {token: vocabulary.index(token) for token in tiny_families.STOP_TOKENS[engine.family]}


def no_stop(engine) -> dict[str, int]:
    """A ``logit_bias`` that keeps every stop token from being sampled (a reply of exactly max_tokens)."""
    return {str(index): -100 for index in stop_ids(engine).values()}


def reference_prompt(engine, messages) -> str:
    """transformers' rendering of ``messages`` with the template and tokenizer it reads from the file."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(engine.gguf_path.parent, gguf_file=engine.gguf_path.name)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_both_endpoints_answer_from_the_file_on_our_runner(family_api, valid_key):
    assert family_api.runner.serving["name"] == "llama"
    assert get(valid_key.plaintext, "/v1/models").body["data"][0]["runner"]["name"] == "llama"
    completion = post(
        valid_key.plaintext, {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "logit_bias": no_stop(family_api)}
    )
    assert completion.status == 200, completion.body
    assert completion.body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}  # a byte a token
    assert completion.body["choices"][0]["finish_reason"] == "length"
    messages = CONVERSATIONS[0]
    chat = post(
        valid_key.plaintext,
        {"model": MODEL, "messages": messages, "max_completion_tokens": 4, "logit_bias": no_stop(family_api)},
        CHAT,
    )
    assert chat.status == 200, chat.body
    prompt = reference_prompt(family_api, messages)
    expected_tokens = len(family_api.tokenizer.encode(prompt, add_special_tokens=False))
    assert chat.body["usage"]["prompt_tokens"] == expected_tokens
    assert chat.body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_the_chat_prompt_is_the_files_template_as_transformers_renders_it(family_api, conversation):
    messages = CONVERSATIONS[conversation]
    if family_api.family in tiny_families.NO_SYSTEM_ROLE and messages[0]["role"] == "system":
        pytest.skip("the family's template has no system role (see the refusal test)")
    ids = family_api.chat_prompt_ids(messages)
    assert family_api.tokenizer.decode(ids) == reference_prompt(family_api, messages)
    # The template's special tokens are single tokens of the file's vocabulary, not their characters.
    specials = set(tiny_families.CHAT_FORMATS[family_api.family][0]) - {"<|endoftext|>"}
    assert any(family_api.tokenizer.convert_ids_to_tokens(index) in specials for index in ids)


def test_a_role_the_template_refuses_is_a_400_naming_the_messages(family_api, valid_key):
    if family_api.family not in tiny_families.NO_SYSTEM_ROLE:
        pytest.skip("the family's template takes a system message")
    reply = post(valid_key.plaintext, {"model": MODEL, "messages": CONVERSATIONS[1], "max_completion_tokens": 4}, CHAT)
    assert reply.status == 400
    words = tiny_families.NO_SYSTEM_ROLE[family_api.family]
    assert reply.error["param"] == "messages" and words in reply.error["message"]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_each_stop_token_of_the_family_ends_a_stream(family_api, valid_key, endpoint):
    for token, index in stop_ids(family_api).items():
        request = {"model": MODEL, "stream": True, "logit_bias": {str(index): 100}}  # the stop token comes first
        if endpoint == "chat":
            reply = post(
                valid_key.plaintext, {**request, "messages": CONVERSATIONS[0], "max_completion_tokens": 8}, CHAT
            )
            text = "".join(e["choices"][0]["delta"].get("content") or "" for e in reply.events[:-1] if e["choices"])
        else:
            reply = post(valid_key.plaintext, {**request, "prompt": "Hello", "max_tokens": 8})
            text = "".join(e["choices"][0]["text"] for e in reply.events[:-1] if e["choices"])
        assert reply.status == 200
        finishes = [e["choices"][0]["finish_reason"] for e in reply.events[:-1] if e["choices"]]
        assert finishes[-1] == "stop", (token, finishes)
        assert text == "" and reply.events[-1] == "[DONE]", token
