"""End to end: the real daphne server and embedded model, called with the openai client and raw HTTP."""

from __future__ import annotations

import httpx

from testing.live_server import MODEL
from testing.sse_client import stream, stream_text

PROMPT = "The weather is very nice today"


def test_openai_client_gets_a_real_text_completion(openai_client):
    completion = openai_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.index == 0 and choice.text.strip()
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage.prompt_tokens == 6
    assert 1 <= completion.usage.completion_tokens <= 16
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_openai_client_stream_equals_the_non_streamed_text(openai_client):
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    whole = openai_client.completions.create(**body).choices[0]
    chunks = list(openai_client.completions.create(**body, stream=True))
    assert len(chunks) > 1
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert len({(c.id, c.created, c.model) for c in chunks}) == 1


def test_raw_stream_ends_with_done_and_carries_usage_when_asked(server):
    response, events = stream(
        server,
        {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 8,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        },
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}
    assert all(event["usage"] is None for event in events[:-2])
    assert response.headers["x-request-id"] == usage_chunk["id"]


def test_stream_without_include_usage_has_no_usage(server):
    _, events = stream(server, {"model": MODEL, "prompt": PROMPT, "max_tokens": 4})
    assert events[-1] == "[DONE]"
    assert all("usage" not in event for event in events[:-1])


def test_greedy_text_with_a_stop_string_is_the_greedy_text_cut_before_it(server):
    greedy = server.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 32, "temperature": 0}).json()
    text = greedy["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop and stop in text
    cut = server.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 32, "temperature": 0, "stop": stop}).json()
    assert cut["choices"][0]["text"] == text[: text.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"
    _, events = stream(
        server, {"model": MODEL, "prompt": PROMPT, "max_tokens": 32, "temperature": 0, "stop": [stop, "zzz"]}
    )
    streamed = stream_text(events)
    assert streamed == text[: text.index(stop)]
    assert stop not in streamed


def test_the_same_seed_gives_the_same_text(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "seed": 1234}
    first = server.post(body).json()["choices"][0]["text"]
    assert server.post(body).json()["choices"][0]["text"] == first


def test_n_returns_that_many_choices_in_order(server):
    body = {"model": MODEL, "prompt": [PROMPT, "Once upon a time"], "max_tokens": 4, "n": 2, "seed": 7}
    result = server.post(body).json()
    assert [c["index"] for c in result["choices"]] == [0, 1, 2, 3]
    assert result["usage"]["prompt_tokens"] == 6 + 4


def test_user_field_is_accepted_and_stored(server):
    response = server.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "user": "user-42"})
    assert response.status_code == 200
    assert server.usage(response.json()["id"])["user"] == "user-42"


def test_models_lists_the_served_model(openai_client):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert openai_client.models.retrieve(MODEL).id == MODEL


def test_unknown_model_is_404_model_not_found(server, openai_client):
    response = server.post({"model": "gpt-5", "prompt": "x"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    detail = httpx.get(server.api_url + "/models/gpt-5", headers=server.headers())
    assert detail.status_code == 404 and detail.json()["error"]["code"] == "model_not_found"


def test_healthz_is_ok_once_loaded(server):
    response = httpx.get(server.base_url + "/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
