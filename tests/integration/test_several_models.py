"""Two models served side by side through the real views, each by its own engine: the tiny Llama
(a character tokenizer) and a tiny Qwen3 GGUF of another shape and tokenizer, both in float32.

``/v1/models`` lists both with their aliases; requests to each, interleaved, come back from their
own model as they would alone; usage and the engine metrics are counted per model; a model the key
may not use is OpenAI's 404 ``model_not_found``; ``/healthz`` reports each model."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from tests.conftest import issue
from tests.inprocess_api import MODEL as SMALL
from tests.inprocess_api import SECOND_ALIAS as BIG_ALIAS
from tests.inprocess_api import SECOND_MODEL as BIG
from tests.inprocess_api import apost, get, post
from tests.inprocess_api import greedy as request

pytest.importorskip("gguf")

pytestmark = pytest.mark.django_db(transaction=True)

PROMPTS = ["Hello", "The sky is", "Once upon a time", "One, two, three"]


def test_the_model_list_shows_every_model_and_its_aliases_in_order(two_models, valid_key):
    listed = get(valid_key.plaintext, "/v1/models").body["data"]

    assert [model["id"] for model in listed] == [SMALL, BIG, BIG_ALIAS]
    assert get(valid_key.plaintext, f"/v1/models/{BIG_ALIAS}").body["id"] == BIG_ALIAS


def test_each_model_answers_from_its_own_engine_and_an_alias_from_its_model(two_models, valid_key):
    small, big = two_models
    replies = [post(valid_key.plaintext, request(name, "Hello")) for name in (SMALL, BIG, BIG_ALIAS)]

    assert [reply.body["model"] for reply in replies] == [SMALL, BIG, BIG]
    assert replies[1].body["choices"][0]["text"] == replies[2].body["choices"][0]["text"]
    assert replies[0].body["usage"]["prompt_tokens"] == len(small.encode("Hello"))  # a character a token
    assert replies[1].body["usage"]["prompt_tokens"] == len(big.encode("Hello"))  # a byte a token


def test_interleaved_requests_to_both_models_answer_as_each_model_alone(two_models, valid_key):
    alone = {
        (model, prompt): post(valid_key.plaintext, request(model, prompt)).body["choices"][0]["text"]
        for model in (SMALL, BIG)
        for prompt in PROMPTS
    }
    mixed = [(model, prompt) for prompt in PROMPTS for model in (SMALL, BIG)]  # alternating, all at once

    async def together():
        return await asyncio.gather(*(apost(valid_key.plaintext, request(*pair)) for pair in mixed))

    replies = async_to_sync(together)()

    assert all(reply.status == 200 for reply in replies)
    assert {pair: reply.body["choices"][0]["text"] for pair, reply in zip(mixed, replies)} == alone
    assert {reply.body["model"] for reply in replies} == {SMALL, BIG}


def test_requests_to_one_model_are_batched_in_its_own_engine(two_models, valid_key):
    small, big = two_models
    small_before, big_before = _count(small), _count(big)

    async def together():
        requests = [request(SMALL, prompt, max_tokens=8) for prompt in PROMPTS]
        return await asyncio.gather(*(apost(valid_key.plaintext, body) for body in requests))

    replies = async_to_sync(together)()

    assert all(reply.status == 200 for reply in replies)
    assert _count(big) == big_before  # the other model's engine took no step
    # Four requests of 8 tokens in fewer decode steps than 4 * 8: they shared the small model's batch.
    assert _count(small) - small_before < 4 * 8


def _count(engine) -> int:
    (metric,) = engine.metrics.decode_step_duration.collect()
    return int(sum(sample.value for sample in metric.samples if sample.name.endswith("_count")))


def test_usage_is_recorded_under_each_model_and_an_alias_under_its_model(two_models, valid_key):
    from keys.models import UsageRecord

    ids = [post(valid_key.plaintext, request(name, "Hi", max_tokens=3)).request_id for name in (SMALL, BIG_ALIAS)]

    records = {record.request_id: record for record in UsageRecord.objects.filter(request_id__in=ids)}
    assert [(records[i].model, records[i].completion_tokens) for i in ids] == [(SMALL, 3), (BIG, 3)]


def test_the_usage_api_groups_and_filters_by_model(two_models, valid_key):
    for name in (SMALL, BIG, BIG):
        assert post(valid_key.plaintext, request(name, "Hi", max_tokens=2)).status == 200

    today = f"/v1/usage/completions?start_time={int(time.time()) - 3600}"  # one daily bucket from an hour ago
    grouped = get(valid_key.plaintext, today + "&group_by=model").body
    results = {row["model"]: row for bucket in grouped["data"] for row in bucket["results"]}
    only_big = get(valid_key.plaintext, today + f"&models={BIG}").body

    assert (results[SMALL]["num_model_requests"], results[BIG]["num_model_requests"]) == (1, 2)
    assert results[BIG]["output_tokens"] == 4
    assert sum(row["num_model_requests"] for bucket in only_big["data"] for row in bucket["results"]) == 2


def test_the_engine_metrics_count_each_model_under_its_model_name(two_models, valid_key):
    from prometheus_client import REGISTRY

    def generated(model: str) -> float:
        return REGISTRY.get_sample_value("completions_generation_tokens_total", {"model_name": model}) or 0.0

    before = {model: generated(model) for model in (SMALL, BIG)}
    post(valid_key.plaintext, request(SMALL, "Hi", max_tokens=3))
    post(valid_key.plaintext, request(BIG, "Hi", max_tokens=5))

    assert {model: generated(model) - before[model] for model in (SMALL, BIG)} == {SMALL: 3, BIG: 5}


def test_a_model_the_key_may_not_use_is_not_found(two_models, user):
    from keys.models import UsageRecord

    small_only = issue(user, "small only", allowed_models=SMALL)

    refused = post(small_only.plaintext, request(BIG, "Hi"))
    by_alias = post(small_only.plaintext, request(BIG_ALIAS, "Hi"))

    assert (refused.status, by_alias.status) == (404, 404)
    assert refused.error == {
        "message": f"The model `{BIG}` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert post(small_only.plaintext, request(SMALL, "Hi")).status == 200
    assert [model["id"] for model in get(small_only.plaintext, "/v1/models").body["data"]] == [SMALL]
    assert get(small_only.plaintext, f"/v1/models/{BIG}").error["code"] == "model_not_found"
    assert UsageRecord.objects.get(request_id=refused.request_id).model == ""


def test_a_key_allowed_an_alias_only_may_use_that_alias_only(two_models, user):
    alias_only = issue(user, "alias only", allowed_models=BIG_ALIAS)

    assert post(alias_only.plaintext, request(BIG_ALIAS, "Hi")).status == 200
    assert post(alias_only.plaintext, request(BIG, "Hi")).status == 404


def test_healthz_reports_each_model_and_their_sums(two_models):
    response = async_to_sync(AsyncClient().get)("/healthz")
    body = response.json()

    assert response.status_code == 200 and body["status"] == "ok"
    assert [(model["id"], model["status"]) for model in body["models"]] == [(SMALL, "ok"), (BIG, "ok")]
    assert "model" not in body and "runner" not in body  # those are each model's, under "models"
    assert all("runner" in model and "weights" in model for model in body["models"])
    assert body["running"] == sum(model["running"] for model in body["models"])


def test_healthz_is_503_while_one_model_loads(two_models, monkeypatch):
    small, big = two_models
    monkeypatch.setattr(big, "ready", False)

    response = async_to_sync(AsyncClient().get)("/healthz")

    assert response.status_code == 503 and response.json()["status"] == "loading"
    assert [model["status"] for model in response.json()["models"]] == ["ok", "loading"]


def test_a_loaded_model_serves_while_the_other_loads(two_models, valid_key, monkeypatch):
    small, big = two_models
    monkeypatch.setattr(big, "ready", False)

    served = post(valid_key.plaintext, request(SMALL, "Hello"))
    loading = post(valid_key.plaintext, request(BIG_ALIAS, "Hello"))

    assert served.status == 200 and served.body["model"] == SMALL
    assert loading.status == 503 and loading.headers["retry-after"] == "5"
    assert loading.error["message"] == "The model is loading; try again shortly."
