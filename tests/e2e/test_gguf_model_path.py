"""End to end: ``MODEL_PATH`` naming a GGUF file serves it through our GGUF reader (its blocks as
stored, its tokenizer and chat template from its metadata), and a file that cannot load ends the
server with a non-zero status and the reason in its log."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from inference.model_loader import embedded_gguf_path
from testing.live_server import ROOT, free_port, start_server, stop_server

MODEL = "smollm2-gguf"


@pytest.fixture(scope="module")
def gguf_server(tmp_path_factory):
    # A copy elsewhere: the server must find everything in the file, nothing beside it.
    folder = tmp_path_factory.mktemp("gguf-model")
    target = folder / "model.gguf"
    target.symlink_to(embedded_gguf_path())
    live = start_server(tmp_path_factory.mktemp("gguf"), MODEL_PATH=str(target), MODEL_ID=MODEL, MODEL_WEIGHTS="auto")
    yield live
    stop_server(live)


def test_a_gguf_file_by_path_is_served_from_its_blocks(gguf_server):
    health = httpx.get(gguf_server.base_url + "/healthz", timeout=10).json()
    assert "GGUF blocks as stored" in str(health)
    assert "GGUF" in gguf_server.log.read_text()
    response = gguf_server.post(
        {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == MODEL and body["choices"][0]["text"].strip()
    assert body["usage"]["prompt_tokens"] == 5


def test_the_chat_endpoint_uses_the_files_chat_template_and_stops_at_its_eos(gguf_server):
    response = httpx.post(
        gguf_server.api_url + "/chat/completions",
        headers=gguf_server.headers(),
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 64,
            "temperature": 0,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["message"]["content"].strip()
    assert choice["finish_reason"] == "stop"  # <|im_end|> from the file's metadata ended it
    assert "<|im_end|>" not in choice["message"]["content"]


@pytest.mark.parametrize(
    "contents, message",
    [
        (b"not a model at all" * 4, "not a GGUF file"),
        (None, "truncated"),
        ("missing", "broken.gguf: no such file or folder"),
        ("folder", "holds neither a GGUF file nor a transformers model's config.json"),
    ],
    ids=["wrong magic", "truncated", "a missing file", "a folder without a model"],
)
def test_a_model_file_that_cannot_load_ends_the_server_with_its_reason(tmp_path, contents, message):
    path = tmp_path / "broken.gguf"
    if contents == "folder":
        path.mkdir()
    elif contents != "missing":  # a missing file is never taken for a hub id: no network, no wait
        path.write_bytes(contents if contents is not None else embedded_gguf_path().read_bytes()[:50_000_000])
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "completions_site.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "MODEL_PATH": str(path),
        "DJANGO_SECRET_KEY": "a-test-secret-key-that-is-not-the-development-one-0123456789",
    }
    process = subprocess.run(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(free_port()), "completions_site.asgi:application"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert process.returncode != 0
    assert message in process.stdout + process.stderr
    assert "Traceback" not in process.stdout + process.stderr  # the reason alone, not after a traceback


# --- another family's file: a tiny Qwen3 GGUF with its ChatML template ------------------------------


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory):
    from inference.formats import ggml
    from testing import tiny_families

    model = tiny_families.tiny_family_model("qwen3", vocab_size=len(tiny_families.vocabulary("qwen3")))
    path = tmp_path_factory.mktemp("qwen3-model") / "tiny-qwen3.gguf"
    tiny_families.write_gguf(model, path, ggml.Q8_0, architecture="qwen3", tokenizer="qwen3")
    live = start_server(
        tmp_path_factory.mktemp("qwen3"), MODEL_PATH=str(path), MODEL_ID="tiny-qwen3", MODEL_WEIGHTS="auto"
    )
    yield live
    stop_server(live)


def test_a_qwen3_gguf_is_served_on_our_runner_through_both_endpoints(qwen3_server):
    models = httpx.get(qwen3_server.api_url + "/models", headers=qwen3_server.headers(), timeout=10).json()
    assert models["data"][0]["runner"] == {
        "name": "llama",
        "reason": "GGUF architecture qwen3: the qwen3 family, read as stored",
    }
    assert "Runner: llama (GGUF architecture qwen3" in qwen3_server.log.read_text()
    # <|im_end|> (id 258) and <|endoftext|> (256) kept from being sampled: exactly max_tokens tokens.
    no_stop = {"256": -100, "258": -100}
    completion = qwen3_server.post(
        {"model": "tiny-qwen3", "prompt": "Hello", "max_tokens": 4, "temperature": 0, "logit_bias": no_stop}
    )
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    chat = httpx.post(
        qwen3_server.api_url + "/chat/completions",
        headers=qwen3_server.headers(),
        json={"model": "tiny-qwen3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
              "logit_bias": {"258": 100}},
        timeout=120,
    )  # fmt: skip
    assert chat.status_code == 200, chat.text
    choice = chat.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == ""  # <|im_end|> ended it
    # ChatML with the default system message: each special token one token, every other byte one.
    prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    expected = len(prompt.replace("<|im_start|>", "S").replace("<|im_end|>", "E"))
    assert chat.json()["usage"]["prompt_tokens"] == expected
