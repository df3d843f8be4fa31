"""End to end: one daphne process serving two models from ``MODELS_CONFIG`` (the embedded SmolLM2 and
a tiny Qwen3 GGUF of another shape and tokenizer, written here with gguf-py's writer), each by its
own engine, in float32 (the deterministic mode); and a second process configured with the small
model only, on the same database, as a machine of another pool behind one gateway would be.

Requests to both models, interleaved, answer as each model alone; a key's limit for one model
refuses that model only; usage, the usage API and ``/metrics`` count each model apart; a model a key
may not use, or one its process does not serve, is OpenAI's 404 ``model_not_found``.  A list of
models past ``MODELS_MEMORY_BUDGET``, or a ``MODELS_CONFIG`` that cannot be served, refuses the start.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testing import tiny_families
from testing.live_server import ROOT, free_port, start_server, stop_server

pytest.importorskip("gguf")

EMBEDDED, EMBEDDED_ALIAS = "smollm2-135m-instruct", "gpt-3.5-turbo-instruct"
TINY, TINY_ALIAS = "tiny-qwen3", "qwen-latest"
EMBEDDED_NO_STOP = {"0": -100, "2": -100}  # neither end-of-text token
TINY_NO_STOP = tiny_families.no_stop_bias("qwen3")
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]

TWO_MODELS = f"""
[[models]]
id = "{EMBEDDED}"
path = "embedded"
aliases = ["{EMBEDDED_ALIAS}"]
context_length = 2048
max_batch_size = 8

[[models]]
id = "{TINY}"
path = "tiny-qwen3.gguf"
aliases = ["{TINY_ALIAS}"]
max_batch_size = 8
"""
TINY_ONLY = f"""
[[models]]
id = "{TINY}"
path = "tiny-qwen3.gguf"
"""


def body(model: str, prompt: str, max_tokens: int = 8) -> dict:
    bias = TINY_NO_STOP if model in (TINY, TINY_ALIAS) else EMBEDDED_NO_STOP
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logit_bias": bias}


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def models_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    tiny_families.write_tiny_gguf(folder / "tiny-qwen3.gguf")
    (folder / "two.toml").write_text(TWO_MODELS)
    (folder / "tiny.toml").write_text(TINY_ONLY)
    return folder


@pytest.fixture(scope="module")
def both(tmp_path_factory, models_folder):
    """The process serving both models."""
    live = start_server(
        tmp_path_factory.mktemp("both"), MODELS_CONFIG=str(models_folder / "two.toml"), MODELS_MEMORY_BUDGET="6GiB"
    )
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def tiny_only(tmp_path_factory, models_folder, both):
    """A second process on the same database, configured with the tiny model only."""
    live = start_server(
        tmp_path_factory.mktemp("tiny-only"),
        database_url=f"sqlite:///{both.database}",
        key=both.key,
        MODELS_CONFIG=str(models_folder / "tiny.toml"),
    )
    yield live
    stop_server(live)


def scrape(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def new_key(server, *options: str) -> str:
    return (
        server.manage("create_api_key", "--name", f"key {time.monotonic_ns()}", "--user", "e2e", *options)
        .strip()
        .splitlines()[-1]
    )


def test_every_model_and_alias_is_listed_and_each_model_reports_its_health(both):
    listed = httpx.get(both.api_url + "/models", headers=both.headers(), timeout=10).json()["data"]
    health = httpx.get(both.base_url + "/healthz", timeout=10).json()

    assert [model["id"] for model in listed] == [EMBEDDED, EMBEDDED_ALIAS, TINY, TINY_ALIAS]
    assert {model["runner"]["name"] for model in listed} == {"llama"}
    assert health["status"] == "ok" and [model["id"] for model in health["models"]] == [EMBEDDED, TINY]
    assert all(model["status"] == "ok" for model in health["models"])
    log = both.log.read_text()
    assert f'Memory: "{EMBEDDED}"' in log and f'Memory: "{TINY}"' in log  # the budget's estimates


def test_interleaved_requests_to_both_models_answer_as_each_model_alone(both):
    alone = {
        (model, prompt): text_of(both.post(body(model, prompt))) for model in (EMBEDDED, TINY) for prompt in PROMPTS
    }
    mixed = [(model, prompt) for prompt in PROMPTS for model in (EMBEDDED, TINY)] * 2
    before = scrape(both)

    with ThreadPoolExecutor(len(mixed)) as pool:
        together = list(pool.map(lambda pair: both.post(body(*pair)), mixed))

    after = scrape(both)
    assert [text_of(response) for response in together] == [alone[pair] for pair in mixed]
    assert [response.json()["model"] for response in together] == [model for model, _ in mixed]

    def moved(name: str, model: str) -> float:
        key = (name, (("model_name", model),))
        return after.get(key, 0.0) - before.get(key, 0.0)

    for model in (EMBEDDED, TINY):  # 6 requests of 8 tokens to each, batched in the model's own engine
        assert moved("completions_generation_tokens_total", model) == 6 * 8
        # Fewer decode steps than tokens after each request's first: the requests shared steps.
        assert moved("completions_decode_step_duration_seconds_count", model) < 6 * 7


def test_an_alias_is_served_and_counted_by_its_model(both):
    response = both.post(body(TINY_ALIAS, "Hello", max_tokens=3))

    assert response.status_code == 200 and response.json()["model"] == TINY
    assert both.usage(response.json()["id"])["model"] == TINY


def test_a_keys_limit_for_one_model_refuses_that_model_only(both):
    key = new_key(both, "--model-limit", f"{TINY}:2:")

    statuses = [both.post(body(TINY, "Hi", max_tokens=1), key=key).status_code for _ in range(2)]
    refused = both.post(body(TINY_ALIAS, "Hi", max_tokens=1), key=key)
    embedded = both.post(body(EMBEDDED, "Hi", max_tokens=1), key=key)

    assert statuses == [200, 200]
    assert refused.status_code == 429
    assert f"for {TINY} on this API key" in refused.json()["error"]["message"]
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert embedded.status_code == 200


def test_usage_and_metrics_are_counted_per_model(both):
    before = scrape(both)
    answers = [both.post(body(model, "Hello", max_tokens=4)) for model in (EMBEDDED, TINY, TINY)]
    after = scrape(both)

    ids = [answer.json()["id"] for answer in answers]
    assert [both.usage(request_id)["model"] for request_id in ids] == [EMBEDDED, TINY, TINY]

    def delta(name: str, model: str, **labels: str) -> float:
        key = (name, tuple(sorted({"model_name": model, **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("completions_generation_tokens_total", EMBEDDED) == 4
    assert delta("completions_generation_tokens_total", TINY) == 8
    assert delta("completions_request_success_total", TINY, finish_reason="length") == 2
    assert delta("completions_e2e_request_latency_seconds_count", EMBEDDED) == 1


def test_a_model_the_key_may_not_use_is_openais_404(both):
    from openai import NotFoundError, OpenAI

    key = new_key(both, "--models", EMBEDDED)
    client = OpenAI(base_url=both.api_url, api_key=key, max_retries=0, timeout=120)

    with pytest.raises(NotFoundError) as refused:
        client.completions.create(model=TINY, prompt="Hi", max_tokens=1)

    assert refused.value.code == "model_not_found" and refused.value.body["param"] == "model"
    assert [model.id for model in client.models.list()] == [EMBEDDED, EMBEDDED_ALIAS]  # the model and its alias
    assert client.completions.create(model=EMBEDDED_ALIAS, prompt="Hi", max_tokens=1).model == EMBEDDED


def test_a_process_configured_otherwise_serves_its_own_models_on_the_same_keys(both, tiny_only):
    listed = httpx.get(tiny_only.api_url + "/models", headers=tiny_only.headers(), timeout=10).json()["data"]
    served = tiny_only.post(body(TINY, "Hello", max_tokens=3))
    elsewhere = tiny_only.post(body(EMBEDDED, "Hello", max_tokens=3))

    assert [model["id"] for model in listed] == [TINY]
    assert text_of(served) == text_of(both.post(body(TINY, "Hello", max_tokens=3)))  # the same file, the same text
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["code"] == "model_not_found"
    # One database: the usage API of either process counts both processes' requests, per model.
    usage = httpx.get(
        both.api_url + "/usage/completions",
        params={"start_time": int(time.time()) - 3600, "group_by": "model"},
        headers=both.headers(),
        timeout=30,
    ).json()
    models = {row["model"] for bucket in usage["data"] for row in bucket["results"]}
    assert {EMBEDDED, TINY} <= models
    with sqlite3.connect(both.database) as connection:
        (rows,) = connection.execute(
            "SELECT COUNT(*) FROM keys_usagerecord WHERE request_id = ?", (served.json()["id"],)
        ).fetchone()
    assert rows == 1


def refused_start(tmp_path, **settings: str) -> str:
    """Start daphne with ``settings`` and return its output, asserting that it exits non-zero."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "completions_site.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SECRET_KEY": "a-test-secret-key-that-is-not-the-development-one-0123456789",
        "USAGE_JOURNAL_DIR": str(tmp_path / "journal"),
        **settings,
    }
    process = subprocess.run(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(free_port()), "completions_site.asgi:application"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert process.returncode != 0
    return process.stdout + process.stderr


def test_models_past_the_memory_budget_refuse_the_start_naming_the_budget(tmp_path, models_folder):
    output = refused_start(tmp_path, MODELS_CONFIG=str(models_folder / "two.toml"), MODELS_MEMORY_BUDGET="200MiB")

    assert f'The model "{EMBEDDED}" does not fit in MODELS_MEMORY_BUDGET=200MiB (200 MiB)' in output


def test_a_models_config_that_cannot_be_served_refuses_the_start_naming_the_table_and_key(tmp_path):
    config = tmp_path / "models.toml"
    config.write_text('[[models]]\nid = "a"\npath = "embedded"\n[[models]]\nid = "b"\npath = "missing.gguf"\n')

    output = refused_start(tmp_path, MODELS_CONFIG=str(config))

    assert "completions_site.E012" in output
    assert f'[[models]] #2 ("b"), key "path": {tmp_path / "missing.gguf"} does not exist' in output
