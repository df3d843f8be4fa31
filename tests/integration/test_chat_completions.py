"""``POST /v1/chat/completions`` in this process, on the tiny model given a chat template.

The tiny tokenizer has one token per character, so the template's prompt length is known
exactly; ``logit_bias`` :data:`NO_EOS` makes every choice run to its token limit.
"""

from __future__ import annotations

import pytest

from tests.inprocess_api import MODEL, NO_EOS, post
from tests.openai_schema import validate

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
# Characters of the tiny alphabet only, so that every prompt character is one known token.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} - {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant - {% endif %}"
)
MESSAGES = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
PROMPT = "system - Be brief.\nuser - Hello\nassistant - "


@pytest.fixture
def chat_api(tiny_api, monkeypatch):
    """The tiny model's views, its tokenizer given :data:`TEMPLATE`."""
    monkeypatch.setattr(tiny_api.tokenizer, "chat_template", TEMPLATE, raising=False)
    return tiny_api


def chat(**fields):
    return {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": 4, "logit_bias": NO_EOS, **fields}


def test_a_chat_answer_is_a_spec_chat_completion_with_the_templates_tokens_counted(chat_api, valid_key):
    reply = post(valid_key.plaintext, chat(), CHAT)

    assert reply.status == 200, reply.body
    validate("CreateChatCompletionResponse", reply.body)
    body = reply.body
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["id"] == reply.request_id and body["model"] == MODEL
    assert body["system_fingerprint"].startswith("fp_")
    [choice] = body["choices"]
    # Four tokens of the tiny model (one character each, or a special token's text such as "<unk>").
    assert choice["message"]["role"] == "assistant" and 4 <= len(choice["message"]["content"]) <= 4 * len("<unk>")
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert body["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 4, "total_tokens": len(PROMPT) + 4}


def test_text_parts_are_read_as_the_string_they_join_to(chat_api, valid_key):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]

    reply = post(valid_key.plaintext, chat(messages=parts, temperature=0), CHAT)

    assert reply.body["usage"]["prompt_tokens"] == len("user - Hel\nlo\nassistant - ")


def test_the_stream_starts_with_the_role_and_ends_with_finish_usage_and_done(chat_api, valid_key):
    fields = chat(n=2, temperature=0, stream=True, stream_options={"include_usage": True})
    reply = post(valid_key.plaintext, fields, CHAT)
    whole = post(valid_key.plaintext, chat(n=2, temperature=0), CHAT).body

    assert reply.status == 200 and reply.events[-1] == "[DONE]"
    chunks = reply.events[:-1]
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == reply.request_id
    first_deltas = {c["choices"][0]["index"]: c["choices"][0]["delta"] for c in chunks[:2]}
    assert first_deltas == {i: {"role": "assistant", "content": "", "refusal": None} for i in (0, 1)}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(c["usage"] is None for c in chunks[:-1])
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == index]
        assert mine[-1] == {"index": index, "delta": {}, "logprobs": None, "finish_reason": "length"}
        assert all(c["finish_reason"] is None for c in mine[:-1])
        text = "".join(c["delta"].get("content", "") for c in mine)
        assert text == whole["choices"][index]["message"]["content"]


def test_logprobs_come_in_the_chat_shape_with_top_logprobs(chat_api, valid_key):
    reply = post(valid_key.plaintext, chat(logprobs=True, top_logprobs=3), CHAT)

    validate("CreateChatCompletionResponse", reply.body)
    choice = reply.body["choices"][0]
    entries = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    assert "".join(entry["token"] for entry in entries) == choice["message"]["content"]
    for entry in entries:
        validate("ChatCompletionTokenLogprob", entry)
        assert bytes(entry["bytes"]).decode() == entry["token"]
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-6


def test_logprobs_without_top_logprobs_have_none_listed(chat_api, valid_key):
    entries = post(valid_key.plaintext, chat(logprobs=True), CHAT).body["choices"][0]["logprobs"]["content"]

    assert len(entries) == 4 and all(entry["top_logprobs"] == [] for entry in entries)


def test_max_tokens_is_the_older_name_of_the_limit(chat_api, valid_key):
    fields = chat(max_tokens=3)
    del fields["max_completion_tokens"]

    assert post(valid_key.plaintext, fields, CHAT).body["usage"]["completion_tokens"] == 3


def test_without_a_limit_a_chat_may_fill_the_context(chat_api, valid_key):
    fields = chat()
    del fields["max_completion_tokens"]

    body = post(valid_key.plaintext, fields, CHAT).body

    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] >= chat_api.max_context - 1


def test_a_limit_beyond_the_context_is_context_length_exceeded(chat_api, valid_key):
    reply = post(valid_key.plaintext, chat(max_completion_tokens=10_000), CHAT)

    assert reply.status == 400
    assert (reply.error["code"], reply.error["param"]) == ("context_length_exceeded", "max_completion_tokens")


def test_stop_strings_end_a_chat_choice_as_on_the_legacy_endpoint(chat_api, valid_key):
    text = post(valid_key.plaintext, chat(temperature=0, max_completion_tokens=8), CHAT).body
    content = text["choices"][0]["message"]["content"]
    stop = content[2:4]

    stopped = post(valid_key.plaintext, chat(temperature=0, max_completion_tokens=8, stop=[stop]), CHAT).body

    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["message"]["content"] == content[: content.index(stop)]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]}, "messages[0].role"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}]}
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    }
                ]
            },
            "messages[0].tool_calls",
        ),
    ],
)
def test_what_the_server_cannot_do_is_a_400_naming_the_parameter(chat_api, valid_key, fields, param):
    reply = post(valid_key.plaintext, chat(**fields), CHAT)

    assert reply.status == 400, reply.body
    assert reply.error["param"] == param and reply.error["type"] == "invalid_request_error"
    assert reply.error["code"] in ("unsupported_parameter", "unsupported_value")


def test_tool_choice_none_and_accepted_fields_change_nothing(chat_api, valid_key):
    fields = chat(temperature=0, tool_choice="none", store=False, metadata={"a": "b"}, modalities=["text"])

    assert post(valid_key.plaintext, fields, CHAT).status == 200


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"messages": []}, "messages", "empty_array"),
        ({"temperature": 3}, "temperature", "decimal_above_max_value"),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "integer_below_min_value"),
        ({"n": 0}, "n", "integer_below_min_value"),
        ({"stop": ""}, "stop", "empty_string"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "missing_required_parameter"),
    ],
)
def test_invalid_fields_get_the_legacy_endpoints_errors(chat_api, valid_key, fields, param, code):
    reply = post(valid_key.plaintext, chat(**fields), CHAT)

    assert reply.status == 400, reply.body
    assert reply.error["param"] == param
    if code is not None:
        assert reply.error["code"] == code


ROLES = "'developer', 'system', 'user', 'assistant', 'tool', and 'function'"  # the spec's branches, in order


@pytest.mark.parametrize(
    ("message", "param", "code", "message_text"),
    [
        (
            {"role": "wizard", "content": "hi"},
            "messages[1].role",
            "invalid_value",
            f"Invalid value for 'messages[1].role': 'wizard'. Supported values are: {ROLES}.",
        ),
        (
            {"role": 5, "content": "hi"},
            "messages[1].role",
            "invalid_value",
            f"Invalid value for 'messages[1].role': 5. Supported values are: {ROLES}.",
        ),
        ({"content": "hi"}, "messages[1].role", "missing_required_parameter", None),
        (
            {"role": "user", "content": None},
            "messages[1].content",
            "invalid_type",
            "Invalid type for 'messages[1].content': expected one of a string or an array, but got null instead.",
        ),
        (
            {"role": "system", "content": 5},
            "messages[1].content",
            "invalid_type",
            "Invalid type for 'messages[1].content': expected one of a string or an array, but got an integer instead.",
        ),
        (
            {"role": "user", "content": [{"type": "video"}]},
            "messages[1].content[0].type",
            "invalid_value",
            (
                "Invalid value for 'messages[1].content[0].type': 'video'. Supported values are: 'text', "
                "'image_url', 'input_audio', and 'file'."
            ),
        ),
        ({"role": "tool", "content": "x"}, "messages[1].tool_call_id", "missing_required_parameter", None),
        ({"role": "user", "content": "hi", "name": 5}, "messages[1].name", "invalid_type", None),
    ],
    ids=[
        "unknown_role",
        "role_not_a_string",
        "no_role",
        "null_content_on_user",
        "number_content_on_system",
        "unknown_content_part",
        "tool_without_its_id",
        "name_not_a_string",
    ],
)
def test_a_message_is_checked_against_the_form_its_role_names(chat_api, valid_key, message, param, code, message_text):
    reply = post(valid_key.plaintext, chat(messages=[MESSAGES[0], message]), CHAT)

    assert reply.status == 400, reply.body
    validate("ErrorResponse", reply.body)
    assert (reply.error["type"], reply.error["code"], reply.error["param"]) == ("invalid_request_error", code, param)
    assert reply.error["message"] == (message_text or reply.error["message"]) and f"'{param}'" in reply.error["message"]


def test_a_response_format_is_checked_against_the_form_its_type_names(chat_api, valid_key):
    reply = post(valid_key.plaintext, chat(response_format={"type": "xml"}), CHAT)

    assert (reply.status, reply.error["code"], reply.error["param"]) == (400, "invalid_value", "response_format.type")
    assert reply.error["message"] == (
        "Invalid value for 'response_format.type': 'xml'. Supported values are: 'text', 'json_schema', and "
        "'json_object'."
    )


def test_every_role_the_server_reads_passes_the_check(chat_api, valid_key):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
        {"role": "user", "content": "Hello", "name": "ann"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]

    assert post(valid_key.plaintext, chat(messages=messages), CHAT).status == 200


def test_unknown_fields_are_unrecognized_as_on_the_legacy_endpoint(chat_api, valid_key):
    reply = post(valid_key.plaintext, chat(foo=1), CHAT)

    assert reply.status == 400 and reply.error["message"] == "Unrecognized request argument supplied: foo"


def test_a_model_without_a_chat_template_is_refused_here_only(tiny_api, valid_key, monkeypatch):
    monkeypatch.setattr(tiny_api.tokenizer, "chat_template", None, raising=False)

    reply = post(valid_key.plaintext, chat(), CHAT)

    assert reply.status == 404 and reply.error["param"] == "model"
    assert "not a chat model" in reply.error["message"]
    assert post(valid_key.plaintext, {"model": MODEL, "prompt": "Hello", "max_tokens": 2}).status == 200


def test_a_system_message_that_the_models_template_refuses_is_a_400_naming_messages(tiny_api, valid_key, monkeypatch):
    # Gemma 2's template has no system role: transformers' apply_chat_template raises its words.
    from testing.tiny_families import GEMMA2_CHAT_TEMPLATE

    monkeypatch.setattr(tiny_api.tokenizer, "chat_template", GEMMA2_CHAT_TEMPLATE, raising=False)

    reply = post(valid_key.plaintext, chat(), CHAT)

    assert reply.status == 400 and reply.error["param"] == "messages"
    assert reply.error["type"] == "invalid_request_error"
    assert "System role not supported" in reply.error["message"]
    assert post(valid_key.plaintext, chat(messages=MESSAGES[1:]), CHAT).status == 200


def test_each_chat_request_leaves_one_record_naming_the_endpoint(chat_api, valid_key):
    from keys.models import UsageRecord

    reply = post(valid_key.plaintext, chat(), CHAT)
    legacy = post(valid_key.plaintext, {"model": MODEL, "prompt": "Hello", "max_tokens": 2})

    record = UsageRecord.objects.get(request_id=reply.request_id)
    assert (record.endpoint, record.model, record.prompt_tokens, record.completion_tokens) == (
        CHAT,
        MODEL,
        len(PROMPT),
        4,
    )
    assert UsageRecord.objects.get(request_id=legacy.request_id).endpoint == "/v1/completions"
    assert UsageRecord.objects.filter(request_id=reply.request_id).count() == 1


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": []}, "tools"),
        ({"functions": []}, "functions"),
        ({"messages": []}, "messages"),
        ({"stop": []}, "stop"),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
        ({"messages": [{"role": "system", "content": []}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi", "tool_calls": []}]},
            "messages[1].tool_calls",
        ),
    ],
)
def test_an_empty_array_openai_refuses_is_its_empty_array_400(chat_api, valid_key, fields, param):
    reply = post(valid_key.plaintext, chat(**fields), CHAT)

    assert reply.status == 400, reply.body
    assert reply.error == {
        "message": f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an empty "
        "array instead.",
        "type": "invalid_request_error",
        "param": param,
        "code": "empty_array",
    }


def test_a_message_spelling_a_special_token_is_counted_as_its_text(chat_api, valid_key):
    # "<eos>" is the tiny tokenizer's one special token; as text it is five tokens ("<", ">": <unk>).
    messages = [{"role": "user", "content": "Hi<eos>there"}]

    reply = post(valid_key.plaintext, chat(messages=messages), CHAT)

    assert reply.status == 200, reply.body
    assert reply.body["usage"]["prompt_tokens"] == len("user - Hi<eos>there\nassistant - ")


def test_the_legacy_endpoint_still_reads_a_prompts_special_tokens(chat_api, valid_key):
    reply = post(valid_key.plaintext, {"model": MODEL, "prompt": "Hi<eos>there", "max_tokens": 1, "logit_bias": NO_EOS})

    assert reply.body["usage"]["prompt_tokens"] == len("Hi") + 1 + len("there")
