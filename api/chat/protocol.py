"""``POST /v1/chat/completions``: the request, the prompt, and the response and chunk shapes.

The source of truth is OpenAI's spec (``CreateChatCompletionRequest``,
``CreateChatCompletionResponse``, ``CreateChatCompletionStreamResponse``,
``ChatCompletionTokenLogprob``), vendored in ``api/openai_schema.json``; schema violations get
OpenAI's wording and codes from :func:`api.errors.schema_error`, as on ``/v1/completions``.

What the engine cannot do is refused with a 400 naming the parameter, never silently ignored:
``tools``/``functions`` (and a ``tool_choice``/``function_call`` other than ``none``), ``audio``,
``modalities`` other than text, ``web_search_options``, ``prediction``, the ``tool``/``function``
roles, and image, audio, file and refusal content parts.  Fields that change nothing about the
output (``metadata``, ``store``, ``service_tier``, ``prompt_cache_key``, ...) are accepted.

:class:`api.chat.serving.ChatRun` serves the request; this module is its protocol alone.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import secrets
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from django.conf import settings
from jsonschema import Draft202012Validator
from jsonschema.exceptions import relevance

from inference.outputs import TokenLogprob
from inference.text import token_bytes, token_text

from ..errors import APIError, schema_error, string_too_short_error, unrecognized_arguments_error
from ..protocol import (
    DEFAULT_MAX_N,
    INT64_RANGE,
    INVALID_JSON_MESSAGE,
    StreamAndStopFields,
    check_logit_bias,
    check_range,
    check_unicode,
    reject_constant,
    spec_document,
)
from ..types import CompletionUsage

if TYPE_CHECKING:
    from inference.sampling import SamplingParams

REQUEST_SCHEMA = "CreateChatCompletionRequest"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# Known fields that cannot change what this server generates: accepted and not used.
ACCEPTED_UNUSED = frozenset(
    {
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "parallel_tool_calls",
        "verbosity",
        "reasoning_effort",
    }
)
NOT_A_CHAT_MODEL = (
    "This is not a chat model and thus not supported in the v1/chat/completions endpoint. "
    "Did you mean to use v1/completions?"
)


# --- The request --------------------------------------------------------------------------------


@cache
def _validator() -> Draft202012Validator:
    """``CreateChatCompletionRequest`` without the ``n`` maximum (``API_MAX_N`` applies instead),
    and with ``tools`` and an assistant message's ``tool_calls`` at least one item long: OpenAI
    refuses them empty (``empty_array``) though the spec gives them no ``minItems``."""
    document = copy.deepcopy(spec_document())
    properties = document["$defs"][REQUEST_SCHEMA]["allOf"][1]["properties"]
    properties["n"].pop("maximum", None)
    properties["tools"]["minItems"] = 1
    document["$defs"]["ChatCompletionMessageToolCalls"]["minItems"] = 1
    return Draft202012Validator({**document, "$ref": f"#/$defs/{REQUEST_SCHEMA}"})


@cache
def _known_fields() -> frozenset[str]:
    """Every property the spec's request schema names, through its ``allOf`` and ``$ref`` s."""
    definitions = spec_document()["$defs"]

    def names(schema: dict[str, Any]) -> set[str]:
        found = set(schema.get("properties", ()))
        for part in schema.get("allOf", ()):
            found |= names(definitions[part["$ref"].rsplit("/", 1)[1]] if "$ref" in part else part)
        return found

    return frozenset(names(definitions[REQUEST_SCHEMA]))


@dataclass(frozen=True)
class ChatCompletionRequest(StreamAndStopFields):
    """A validated ``CreateChatCompletionRequest``: the supported fields, with the spec's defaults.

    ``messages`` are normalised to ``{"role", "content"}`` with ``role`` one of system, user,
    assistant (``developer`` is system) and ``content`` a string (text parts joined by newlines).
    ``max_completion_tokens`` is the one limit (the older ``max_tokens`` when it is not sent;
    None: the context's remainder).  Build it with :func:`parse_chat_request`.
    """

    model: str
    messages: list[dict[str, str]]
    frequency_penalty: float = 0.0
    logit_bias: dict[str, int] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    presence_penalty: float = 0.0
    response_format: dict[str, Any] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    user: str | None = None

    @property
    def max_tokens(self) -> int:
        """The most tokens any choice may generate, once :meth:`api.chat.serving.ChatRun.prepare` knows the prompt."""
        return self.max_completion_tokens or 1

    def sampling_params(self, *, max_tokens: int | None = None) -> SamplingParams:
        """The engine's parameters; ``max_tokens`` overrides the request's limit (the context's
        remainder when the client sent none)."""
        from inference.sampling import SamplingParams  # torch stays out of the views' imports

        return SamplingParams(
            max_tokens=max_tokens or self.max_tokens,
            temperature=float(self.temperature),
            top_p=float(self.top_p),
            n=self.n,
            best_of=self.n,
            presence_penalty=float(self.presence_penalty),
            frequency_penalty=float(self.frequency_penalty),
            logit_bias={int(token): float(bias) for token, bias in (self.logit_bias or {}).items()},
            seed=self.seed,
            stop=self.stop_sequences,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
        )

    def check_token_ids(self, vocab_size: int) -> None:
        """``logit_bias`` keys must be this model's token ids (400 ``invalid_value``, ``logit_bias``)."""
        from ..errors import invalid_value_error

        for key in self.logit_bias or {}:
            if not 0 <= int(key) < vocab_size:
                why = f"Keys must be token ids of this model, 0 to {vocab_size - 1}."
                raise invalid_value_error("logit_bias", key, why=why)


def parse_chat_request(body: bytes) -> ChatCompletionRequest:
    """Parse and validate a ``POST /v1/chat/completions`` body.

    Raises ``APIError`` 400 ``invalid_request_error``, in this order: not JSON; not an object or
    against the spec's schema (:func:`api.errors.schema_error`, ``param`` the path, e.g.
    ``messages[0].role``); unknown fields ("Unrecognized request argument supplied"); a supported
    field the server cannot honour (``unsupported_parameter`` / ``unsupported_value``, naming it);
    then the rules beyond the schema (server caps, int64 ``seed``, empty stop strings,
    ``top_logprobs`` without ``logprobs``, ``stream_options`` without ``stream``).
    """
    import json

    try:
        data = json.loads(body, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise APIError(INVALID_JSON_MESSAGE) from None
    if isinstance(data, dict):
        unknown = set(data) - _known_fields()
        if unknown:
            raise unrecognized_arguments_error(sorted(unknown))
        data = {name: value for name, value in data.items() if value is not None or name in ("model", "messages")}
    error = max(_validator().iter_errors(data), key=relevance, default=None)
    if error is not None:
        raise schema_error(error, root=_validator().schema)
    check_unicode(data)
    _check_unsupported(data)
    if "logit_bias" in data:
        data["logit_bias"] = check_logit_bias(data["logit_bias"])
    for name in ("n", "seed", "max_tokens", "max_completion_tokens", "top_logprobs"):
        if name in data:
            data[name] = int(data[name])
    _check_rules(data)
    limit = data.pop("max_completion_tokens", None) or data.pop("max_tokens", None)
    data.pop("max_tokens", None)
    # What is left beyond the dataclass's fields was accepted as changing nothing (ACCEPTED_UNUSED,
    # tool_choice "none", modalities ["text"], ...).
    wanted = {field.name for field in dataclasses.fields(ChatCompletionRequest)}
    fields = {name: data[name] for name in data if name in wanted}
    fields["messages"] = [_message(index, message) for index, message in enumerate(data["messages"])]
    return ChatCompletionRequest(**fields, max_completion_tokens=limit)


def _unsupported(param: str, what: str) -> APIError:
    return APIError(
        f"Unsupported parameter: '{param}' is not supported by this server: {what}",
        param=param,
        code="unsupported_parameter",
    )


def _check_unsupported(data: dict[str, Any]) -> None:
    """400 for the fields the engine cannot honour, naming each (the first found)."""
    for name in ("tools", "functions"):
        if data.get(name):
            raise _unsupported(name, "the model has no tool calling.")
    for name in ("tool_choice", "function_call"):
        if name in data and data[name] != "none":
            raise _unsupported(name, "the model has no tool calling; only 'none' is accepted.")
    for name, why in (
        ("audio", "the model writes text only."),
        ("web_search_options", "there is no web search."),
        ("prediction", "predicted outputs are not implemented."),
    ):
        if name in data:
            raise _unsupported(name, why)
    if "modalities" in data and set(data["modalities"]) != {"text"}:
        raise _unsupported("modalities", 'the model writes text only: use ["text"].')


def _message(index: int, message: dict[str, Any]) -> dict[str, str]:
    """One message as ``{"role", "content"}`` for the chat template, or 400 naming what is unsupported."""
    role = message["role"]
    if role not in ROLES:
        raise APIError(
            f"Invalid value for 'messages[{index}].role': '{role}' messages are not supported by this server "
            "(it has no tool calling); use system, developer, user or assistant.",
            param=f"messages[{index}].role",
            code="unsupported_value",
        )
    for name in ("tool_calls", "function_call", "audio"):
        if message.get(name):
            raise _unsupported(f"messages[{index}].{name}", "the model has no tool calling or audio.")
    content = message.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):
        texts = []
        for part_index, part in enumerate(content):
            if part.get("type") != "text":
                param = f"messages[{index}].content[{part_index}].type"
                raise APIError(
                    f"Invalid value for '{param}': '{part.get('type')}' content parts are not supported by this "
                    "server, which reads text only; use 'text' parts.",
                    param=param,
                    code="unsupported_value",
                )
            texts.append(part["text"])
        content = "\n".join(texts)  # vLLM's join too; the template sees one string per message
    return {"role": ROLES[role], "content": content}


def _check_rules(data: dict[str, Any]) -> None:
    """The rules the schema cannot express, each naming its ``param`` in the schema errors' codes."""
    for name in ("max_completion_tokens", "max_tokens"):
        if name in data:
            check_range(data[name], 1, 2**31 - 1, name)
    check_range(data.get("n", 1), 1, getattr(settings, "API_MAX_N", DEFAULT_MAX_N), "n")
    if "seed" in data:
        check_range(data["seed"], *INT64_RANGE, "seed")
    if "top_logprobs" in data and not data.get("logprobs"):
        raise APIError(
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is set.",
            param="top_logprobs",
            code="invalid_value",
        )
    stop = data.get("stop")
    if isinstance(stop, str) and not stop:
        raise string_too_short_error("stop", 1, 0)
    if isinstance(stop, list) and "" in stop:
        raise string_too_short_error(f"stop[{stop.index('')}]", 1, 0)
    if "stream_options" in data and not data.get("stream"):
        raise APIError(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
        )


# --- Responses ----------------------------------------------------------------------------------


def new_chat_completion_id() -> str:
    """``"chatcmpl-"`` and 24 URL-safe random characters (144 bits), as OpenAI's ids look."""
    return "chatcmpl-" + secrets.token_urlsafe(18)


def chat_response(
    id: str, created: int, model: str, fingerprint: str, choices: list[dict], usage: CompletionUsage
) -> dict[str, Any]:
    """``CreateChatCompletionResponse``: ``{"id", "object": "chat.completion", "created", "model",
    "choices", "usage", "system_fingerprint"}``."""
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage,
        "system_fingerprint": fingerprint,
    }


def chat_choice(index: int, content: str, finish_reason: str | None, logprobs: list[dict] | None) -> dict[str, Any]:
    """A response choice: ``{"index", "message": {"role", "content", "refusal", "annotations"},
    "logprobs": {"content", "refusal"} | null, "finish_reason"}``."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    return {"index": index, "message": message, "logprobs": _logprobs_object(logprobs), "finish_reason": finish_reason}


def chat_chunk(
    id: str,
    created: int,
    model: str,
    fingerprint: str,
    choices: list[dict],
    usage: CompletionUsage | None = None,
    include_usage: bool = False,
) -> dict[str, Any]:
    """``CreateChatCompletionStreamResponse``; with ``include_usage`` every chunk has ``usage``
    (null but on the last, whose ``choices`` are ``[]``), as ``ChatCompletionStreamOptions`` says."""
    chunk = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
    }
    if include_usage or usage is not None:
        chunk["usage"] = usage
    return chunk


def chunk_choice(
    index: int, delta: dict[str, Any], finish_reason: str | None = None, logprobs: list[dict] | None = None
) -> dict[str, Any]:
    """A stream choice: ``{"index", "delta", "logprobs", "finish_reason"}``."""
    return {"index": index, "delta": delta, "logprobs": _logprobs_object(logprobs), "finish_reason": finish_reason}


def _logprobs_object(content: list[dict] | None) -> dict[str, Any] | None:
    return None if content is None else {"content": content, "refusal": None}


def token_logprob(tokenizer: Any, entry: TokenLogprob) -> dict[str, Any]:
    """``ChatCompletionTokenLogprob``: ``{"token", "logprob", "bytes", "top_logprobs": [{"token",
    "logprob", "bytes"}]}``; a token that is not whole UTF-8 is ``bytes:\\xNN`` in ``token``, its
    real bytes in ``bytes``.  Alternatives a structured-output grammar forbade (``-inf``) are left out.
    """

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        raw = token_bytes(tokenizer, token_id)
        text = token_text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(raw if raw is not None else text.encode())}

    top = [item(token_id, value) for token_id, value in entry.top if math.isfinite(value)]
    logprob = entry.logprob if entry.logprob is not None else float("-inf")  # generated tokens always have one
    return {**item(entry.token_id, logprob), "top_logprobs": top}
