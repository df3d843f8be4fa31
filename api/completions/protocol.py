"""The request and response schemas of ``/v1/completions``, in one module.

Views stay thin: they hand the raw body to :func:`parse_completion_request`, which returns a
:class:`CompletionRequest` or raises :class:`~api.errors.APIError` (400, with ``param``);
:meth:`CompletionRequest.sampling_params` turns it into the engine's
:class:`~inference.sampling.SamplingParams`; the builders at the bottom produce response bodies as
plain dicts whose keys are in OpenAI's order, so ``json.dumps`` matches OpenAI's output in shape.

The source of truth is OpenAI's OpenAPI spec (``CreateCompletionRequest``,
``CreateCompletionResponse``, ``CompletionUsage``), vendored in ``api/openai_schema.json``
(:mod:`api.protocol` reads it, with what the chat endpoint shares).  Schema violations get OpenAI's
``code`` and wording from :func:`api.errors.schema_error`, e.g. ``"Invalid 'temperature': decimal
above maximum value. Expected a value <= 2, but got 2.5 instead."`` (``decimal_above_max_value``).
The rules the schema cannot express (``best_of >= n``, ``stream_options`` only with ``stream``,
server caps from settings, ...) are in :func:`_check_rules_beyond_schema`, built with the same
helpers of ``api.errors``, each naming its ``param``.

Nothing here imports torch: ``SamplingParams`` is imported inside ``sampling_params()``.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from django.conf import settings
from jsonschema import Draft202012Validator
from jsonschema.exceptions import relevance

from api.errors import (
    APIError,
    above_maximum_error,
    array_too_long_error,
    array_too_short_error,
    below_minimum_error,
    invalid_type_error,
    invalid_value_error,
    param_path,
    schema_error,
    shorten,
    string_too_short_error,
    unrecognized_arguments_error,
)
from api.protocol import (
    DEFAULT_MAX_N,
    INT64_RANGE,
    INVALID_JSON_MESSAGE,
    StreamAndStopFields,
    check_logit_bias,
    check_range,
    check_unicode,
    is_integer,
    reject_constant,
    spec_document,
)
from api.response_format import check_response_format
from api.types import (
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionUsage,
    CreateCompletionResponse,
)

if TYPE_CHECKING:
    from inference.sampling import SamplingParams

# The spec's prompt forms: a string, strings, token ids, or lists of token ids.
Prompt = str | list[str] | list[int] | list[list[int]]

DEFAULT_MAX_PROMPTS = 64
DEFAULT_MAX_QUEUE = 256  # ENGINE_MAX_QUEUE's default
DEFAULT_MAX_LOGPROBS = 5
MAX_STOP_SEQUENCES = 4  # StopConfiguration: "Up to 4 sequences" (maxItems 4)


# --- The request's schema -----------------------------------------------------------------------


@cache
def _request_validator() -> Draft202012Validator:
    """``CreateCompletionRequest`` without the ``n`` and ``logprobs`` maxima.

    Those caps are server settings (``API_MAX_N``, ``API_MAX_LOGPROBS``) that may differ from the
    spec's 128 and 5, so :func:`_check_rules_beyond_schema` applies them instead.
    """
    document = copy.deepcopy(spec_document())
    properties = document["$defs"]["CreateCompletionRequest"]["properties"]
    for name in ("n", "logprobs"):
        properties[name].pop("maximum", None)
    return Draft202012Validator({**document, "$ref": "#/$defs/CreateCompletionRequest"})


@cache
def _request_fields() -> tuple[frozenset[str], tuple[str, ...]]:
    """The request's known field names and its required ones, from the spec."""
    schema = spec_document()["$defs"]["CreateCompletionRequest"]
    # response_format is our extension (structured output, as on the chat endpoint).
    return frozenset(schema["properties"]) | {"response_format"}, tuple(schema.get("required", ()))


# --- The request --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompletionRequest(StreamAndStopFields):
    """A validated ``CreateCompletionRequest``: fields in the spec's order, with the spec's defaults.

    ``null`` for an optional field means its default.  Numbers are normalised (``1.0`` → ``1`` for
    integer fields, ``1`` → ``1.0`` for number fields); strings, lists and maps are kept as sent
    (``stop`` may be a string or a list, ``prompt`` any of the four forms, ``logit_bias`` keys are
    strings).  ``best_of`` is 1 unless sent; the engine runs ``max(best_of, n)`` candidates.
    Build it with :func:`parse_completion_request`; constructing it directly skips validation.
    """

    model: str
    prompt: Prompt
    best_of: int = 1
    echo: bool = False
    frequency_penalty: float = 0.0
    logit_bias: dict[str, int] | None = None
    logprobs: int | None = None
    max_tokens: int = 16
    n: int = 1
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    suffix: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    user: str | None = None
    response_format: dict[str, Any] | None = None  # our extension: see api/response_format.py

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string, or a list of token ids.

        ``"a"`` → ``["a"]``; ``["a", "b"]`` as is; ``[1, 2]`` → ``[[1, 2]]``; ``[[1], [2]]`` as is.
        Choice ``i`` of prompt ``p`` has ``index = p * n + i`` in the response (OpenAI's order).
        """
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], int):
            return [list(self.prompt)]
        return list(self.prompt)  # type: ignore[arg-type]  # not token ids, so strings or lists of token ids

    def sampling_params(self, *, ignore_eos: bool = False) -> SamplingParams:
        """The engine's parameters for each prompt of this request.

        ``logit_bias`` keys become ints; ``best_of`` is ``max(best_of, n)`` (OpenAI returns ``n``
        choices when ``best_of`` is not sent); ``prompt_logprobs`` is ``echo`` with ``logprobs``
        (OpenAI returns the echoed prompt's logprobs then).
        """
        from inference.sampling import SamplingParams  # torch stays out of the views' imports

        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=float(self.temperature),
            top_p=float(self.top_p),
            n=self.n,
            best_of=max(self.best_of, self.n),
            presence_penalty=float(self.presence_penalty),
            frequency_penalty=float(self.frequency_penalty),
            logit_bias={int(token): float(bias) for token, bias in (self.logit_bias or {}).items()},
            seed=self.seed,
            stop=self.stop_sequences,
            logprobs=self.logprobs,
            prompt_logprobs=self.echo and self.logprobs is not None,
            ignore_eos=ignore_eos,
        )

    def check_token_ids(self, vocab_size: int) -> None:
        """Reject token ids the model does not have, in token-id prompts and ``logit_bias`` keys.

        Raises ``APIError`` 400: ``integer_above_max_value`` (or ``_below_min_``) with ``param`` the
        token's place (``prompt[3]``, ``prompt[1][3]``), or ``invalid_value`` for a ``logit_bias`` key,
        naming the id and ``vocab_size``.  Call it once the model is known (the spec cannot know the
        vocabulary).
        """
        vocabulary = f"This model's vocabulary has {vocab_size} tokens (ids 0 to {vocab_size - 1})."
        single = self.prompt and isinstance(self.prompt, list) and isinstance(self.prompt[0], int)
        for index, prompt in enumerate(self.prompts):
            if isinstance(prompt, list):
                for position, token in enumerate(prompt):
                    param = param_path(["prompt", position] if single else ["prompt", index, position])
                    if token < 0:
                        raise below_minimum_error(param, 0, token, integer=True, why=vocabulary)
                    if token >= vocab_size:
                        raise above_maximum_error(param, vocab_size - 1, token, integer=True, why=vocabulary)
        for key in self.logit_bias or {}:
            if not 0 <= int(key) < vocab_size:
                raise invalid_value_error("logit_bias", key, why=f"Keys must be token ids of this model. {vocabulary}")

    def check_context_length(self, prompt_tokens: int, context_length: int) -> None:
        """Reject a prompt of ``prompt_tokens`` tokens whose ``max_tokens`` would not fit the model.

        Raises ``APIError`` 400, code ``context_length_exceeded``, with OpenAI's message; ``param``
        is ``"prompt"`` if the prompt alone does not fit, else ``"max_tokens"``.
        """
        requested = prompt_tokens + self.max_tokens
        if requested <= context_length:
            return
        raise APIError(
            f"This model's maximum context length is {context_length} tokens, however you requested "
            f"{_integer_text(requested)} tokens ({prompt_tokens} in your prompt; {_integer_text(self.max_tokens)} "
            "for the completion). Please reduce your prompt; or completion length.",
            param="prompt" if prompt_tokens >= context_length else "max_tokens",
            code="context_length_exceeded",
        )


INTEGER_FIELDS = ("best_of", "logprobs", "max_tokens", "n", "seed")
NUMBER_FIELDS = ("frequency_penalty", "presence_penalty", "temperature", "top_p")


def parse_completion_request(body: bytes) -> CompletionRequest:
    """Parse and validate a ``POST /v1/completions`` body (``CreateCompletionRequest``).

    Each failure is an ``APIError`` 400 ``invalid_request_error``, found in this order: the body is
    not JSON (``param`` None); it is not an object (``invalid_type``, None); it has fields the spec
    does not know ("Unrecognized request argument supplied: foo", None, as OpenAI answers); it breaks
    the spec's schema or misses a required field (the most relevant error by jsonschema's
    ``relevance``, in OpenAI's words and code by :func:`api.errors.schema_error`, ``param`` its
    path, e.g. ``stream_options.include_usage``); then the rules the schema cannot express
    (:func:`_check_prompt`, :func:`check_logit_bias`, :func:`_check_rules_beyond_schema`).
    The body size cap is the view's (see :func:`body_too_large_error`).
    """
    data = _load_request_object(body)
    error = max(_request_validator().iter_errors(_schema_view(data)), key=relevance, default=None)
    if error is not None:
        raise schema_error(error)
    check_unicode(data)
    if "response_format" in data:
        check_response_format(data["response_format"])
    if "prompt" in data:  # a required field: present once the schema has passed
        data["prompt"] = _check_prompt(data["prompt"])
    if "logit_bias" in data:
        data["logit_bias"] = check_logit_bias(data["logit_bias"])
    for name in INTEGER_FIELDS:
        if name in data:
            data[name] = int(data[name])  # the schema accepts 2.0 as an integer
    for name in NUMBER_FIELDS:
        if name in data:
            data[name] = float(data[name])
    _check_rules_beyond_schema(data)
    return CompletionRequest(**data)


def _load_request_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object of known fields, with null optional fields left out.

    Raises ``APIError`` 400 for invalid JSON, a body that is not an object, or unknown fields.
    """
    try:
        data = json.loads(body, parse_constant=reject_constant)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise APIError(INVALID_JSON_MESSAGE) from None
    if not isinstance(data, dict):
        raise schema_error(max(_request_validator().iter_errors(data), key=relevance))
    known, required = _request_fields()
    unknown = set(data) - known
    if unknown:
        raise unrecognized_arguments_error(list(unknown))
    # null means "the default" for every optional field, even those the spec forgot to mark
    # nullable (``user``); required fields keep their null so the schema can say what is wrong.
    return {name: value for name, value in data.items() if value is not None or name in required}


def _schema_view(data: dict[str, Any]) -> dict[str, Any]:
    """What jsonschema checks: ``data`` with valid stand-ins for a prompt list and a logit_bias map.

    jsonschema spends microseconds on each array item or map entry (and ``oneOf`` walks all four
    prompt forms), so a 4 MB body of token ids would cost seconds of CPU; the two fields that grow
    with the body are checked in Python by :func:`_check_prompt` and :func:`check_logit_bias`.
    Raises ``APIError`` 400 ``array_above_max_length`` for more stop sequences than the spec's 4.
    """
    stop = data.get("stop")
    if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
        # The schema's maxItems error, before its ``items`` walks a million stop strings to get there.
        raise array_too_long_error("stop", MAX_STOP_SEQUENCES, len(stop))
    view = dict(data)
    view.pop("response_format", None)  # not the spec's: check_response_format checks it
    if isinstance(view.get("prompt"), list):
        view["prompt"] = ""
    if isinstance(view.get("logit_bias"), dict):
        view["logit_bias"] = {}
    return view


def _check_prompt(prompt: Prompt | None) -> Prompt:
    """The prompt with token ids as ints (``2.0`` → ``2``) and null as the spec's default.

    A list must be one of the spec's forms (strings, token ids, lists of token ids), non-empty,
    with token ids >= 0; the form is the first item's.  Raises ``APIError`` 400 in the schema's
    words (:mod:`api.errors`), ``param`` the offending item: ``empty_array`` (``prompt``,
    ``prompt[1]``), ``invalid_type`` (``prompt[2]``, ``prompt[1][0]``), ``integer_below_min_value``.
    jsonschema would say the same, but walks a million token ids in seconds, hence Python here.
    """
    if prompt is None:
        return "<|endoftext|>"  # the spec's default: the model's document separator
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        # The spec's array-of-strings form has no minItems, but an empty batch asks for nothing.
        raise array_too_short_error("prompt", 1, 0)
    first = prompt[0]
    if isinstance(first, str):
        _check_items(prompt, ["prompt"], lambda item: isinstance(item, str), "a string")
        return _check_prompt_count(prompt)
    if is_integer(first):
        return _token_ids(prompt, ["prompt"])  # type: ignore[arg-type]  # token ids by its first item; _token_ids checks every item
    if isinstance(first, list):
        _check_items(prompt, ["prompt"], lambda item: isinstance(item, list), "an array of integers")
        return _check_prompt_count([_token_ids(ids, ["prompt", index]) for index, ids in enumerate(prompt)])  # type: ignore[arg-type]  # every item a list (checked above); _token_ids checks their ids
    raise invalid_type_error("prompt[0]", ["a string", "an integer", "an array of integers"], first)


def _check_items(items: list, path: list, accepts: Callable[[Any], bool], expected: str) -> None:
    """``invalid_type`` naming the first item of ``items`` that ``accepts`` refuses (``prompt[3]``)."""
    for index, item in enumerate(items):
        if not accepts(item):
            raise invalid_type_error(param_path([*path, index]), [expected], item)


def _check_prompt_count(prompts: list) -> list:
    """A batch of prompts, at most ``settings.API_MAX_PROMPTS`` of them, and never more than the
    engine's queue holds (``ENGINE_MAX_QUEUE``): each prompt is one engine request, so a larger
    batch could only ever get a 503; it is a 400 ``array_above_max_length``."""
    limit = min(
        getattr(settings, "API_MAX_PROMPTS", DEFAULT_MAX_PROMPTS),
        getattr(settings, "ENGINE_MAX_QUEUE", DEFAULT_MAX_QUEUE),
    )
    if len(prompts) > limit:
        raise array_too_long_error("prompt", limit, len(prompts))
    return prompts


def _token_ids(ids: list[int | float], path: list) -> list[int]:
    """``ids`` (at ``path``, e.g. ``["prompt", 1]``) as ints.

    Raises ``APIError`` 400: ``empty_array``, ``invalid_type`` for an item that is not an integer,
    ``integer_below_min_value`` for a negative id; ``param`` the item (``prompt[1][0]``).
    """
    if not ids:
        raise array_too_short_error(param_path(path), 1, 0)
    _check_items(ids, path, is_integer, "an integer")
    tokens = [int(token) for token in ids]
    lowest = min(tokens)
    if lowest < 0:
        raise below_minimum_error(param_path([*path, tokens.index(lowest)]), 0, lowest, integer=True)
    return tokens


def _check_rules_beyond_schema(data: dict[str, Any]) -> None:
    """The rules the spec's schema cannot express, in the spec's field order; ``data`` has passed it.

    Each raises ``APIError`` 400 naming its ``param``, in the schema errors' form and codes:
    ``best_of < n`` and ``max_tokens: 0`` without ``echo`` are ``integer_below_min_value``; the
    server caps (``API_MAX_N``, ``API_MAX_LOGPROBS``) and int64 ``seed`` are ``integer_*_value``;
    ``best_of > 1`` with ``stream`` is ``invalid_value``; an empty stop string is ``empty_string``;
    ``stream_options`` without ``stream`` is OpenAI's own message (code null, as OpenAI sends it).
    """
    n, stream, echo = data.get("n", 1), data.get("stream", False), data.get("echo", False)
    if "best_of" in data:
        if data["best_of"] < n:
            raise below_minimum_error(
                "best_of", n, data["best_of"], integer=True, why="best_of must be greater than or equal to n."
            )
        if data["best_of"] > 1 and stream:
            # The spec on best_of: "Results cannot be streamed" (the best is known only at the end).
            raise invalid_value_error("best_of", data["best_of"], why="best_of > 1 cannot be used with stream.")
    if "logprobs" in data:
        max_logprobs = getattr(settings, "API_MAX_LOGPROBS", DEFAULT_MAX_LOGPROBS)
        check_range(data["logprobs"], 0, max_logprobs, "logprobs")
    if data.get("max_tokens") == 0 and not echo:
        # 0 is in the spec's range, but it only makes sense to echo (score) the prompt.
        raise below_minimum_error("max_tokens", 1, 0, integer=True, why="max_tokens may be 0 only with echo.")
    check_range(n, 1, getattr(settings, "API_MAX_N", DEFAULT_MAX_N), "n")
    if "seed" in data:
        check_range(data["seed"], *INT64_RANGE, "seed")
    stop = data.get("stop")
    if isinstance(stop, str) and not stop:
        # An empty stop string would match at once; vLLM drops it silently, we say so.
        raise string_too_short_error("stop", 1, 0)
    if isinstance(stop, list) and "" in stop:
        raise string_too_short_error(f"stop[{stop.index('')}]", 1, 0)
    if "stream_options" in data and not stream:
        raise APIError(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
        )


def _integer_text(value: int) -> str:
    """``value`` in digits, shortened; one too long for ``str`` (over Python's 4300 digits) by its size."""
    try:
        return shorten(str(value))
    except ValueError:
        return f"a {value.bit_length()}-bit number of"


# --- Responses ----------------------------------------------------------------------------------


def new_completion_id() -> str:
    """A fresh completion id: ``"cmpl-"`` and 24 URL-safe random characters (144 bits)."""
    return "cmpl-" + secrets.token_urlsafe(18)


def completion_choice(
    index: int, text: str, finish_reason: str | None, logprobs: CompletionLogprobs | None = None
) -> CompletionChoice:
    """One choice: ``{"text", "index", "logprobs", "finish_reason"}``.

    ``finish_reason`` is ``"stop"`` or ``"length"``, or ``None`` on a stream chunk before the last
    (OpenAI streams it as null, though the spec's enum lacks null).  ``logprobs``: :func:`logprobs_dict`.
    """
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}


def logprobs_dict(
    tokens: list[str],
    token_logprobs: list[float | None],
    top_logprobs: list[dict[str, float] | None],
    text_offset: list[int],
) -> CompletionLogprobs:
    """A choice's ``logprobs``: four parallel lists, one entry per token.

    With ``echo`` the first prompt token has no logprob: OpenAI sends ``None`` in
    ``token_logprobs`` and ``top_logprobs`` there.  ``text_offset`` is each token's character
    offset in the choice's text (the echoed prompt included).
    """
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def completion_response(
    id: str, created: int, model: str, choices: list[CompletionChoice], usage: CompletionUsage
) -> CreateCompletionResponse:
    """``CreateCompletionResponse``: ``{"id", "object", "created", "model", "choices", "usage"}``.

    ``object`` is ``"text_completion"``; ``created`` is a Unix time in seconds; ``choices`` come
    from :func:`completion_choice`, ``usage`` from :func:`usage_dict`.
    """
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def completion_chunk(
    id: str,
    created: int,
    model: str,
    choices: list[CompletionChoice],
    usage: CompletionUsage | None = None,
    include_usage: bool = False,
) -> CompletionChunk:
    """One stream event's body: the response's shape and ``"object": "text_completion"``, as OpenAI streams.

    With ``include_usage`` (``stream_options.include_usage``) every chunk carries ``"usage"``: null
    on all but the last, which has ``choices=[]`` and the request's ``usage``
    (``ChatCompletionStreamOptions`` in the spec).  Without it there is no ``usage`` key unless
    ``usage`` is given.
    """
    chunk: CompletionChunk = {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if include_usage or usage is not None:
        chunk["usage"] = usage
    return chunk
