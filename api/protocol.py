"""What the generation endpoints' protocols share, and ``/v1/models``.

The source of truth is OpenAI's OpenAPI spec, vendored as JSON Schema 2020-12 in
``api/openai_schema.json`` by ``tools/vendor_openai_schema.py`` (:func:`spec_document`,
:func:`spec_validator`).  Each endpoint's own protocol (:mod:`api.completions.protocol`,
:mod:`api.chat.protocol`) validates its request against it and builds its responses; both read the
``stream``/``stop`` fields alike (:class:`StreamAndStopFields`), check the rules beyond the schema with
the helpers here (in :mod:`api.errors`' words, each naming its ``param``), and count ``usage`` with
:func:`usage_dict`.  The errors the views raise before any endpoint's parser (a body too large, an
unknown model) and the ``Model``/``ListModelsResponse`` builders are here too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from api.errors import (
    APIError,
    above_maximum_error,
    below_minimum_error,
    invalid_type_error,
    invalid_value_error,
    param_path,
    shorten,
)
from api.types import CompletionUsage, ListModelsResponse, Model, ModelRunnerInfo

SCHEMA_PATH = Path(__file__).with_name("openai_schema.json")

INVALID_JSON_MESSAGE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
    "HTTP library correctly. The API expects a JSON payload, but what was sent was not valid JSON.)"
)
DEFAULT_MAX_N = 20
MAX_TOKEN_ID_DIGITS = 18  # any real vocabulary's ids fit; longer strings would not even fit an int64
LOGIT_BIAS_RANGE = (-100, 100)  # the spec's description: "an associated bias value from -100 to 100"
INT64_RANGE = (-(2**63), 2**63 - 1)  # seed is ``format: int64`` in the spec


# --- The vendored spec --------------------------------------------------------------------------


@cache
def spec_document() -> dict[str, Any]:
    """``api/openai_schema.json``: ``{"$schema", "$comment", "$defs": {name: schema}}``."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@cache
def spec_validator(schema_name: str) -> Draft202012Validator:
    """A validator for one of the spec's schemas, exactly as vendored (e.g. ``"Model"``).

    Raises ``KeyError`` for a name that is not in ``api/openai_schema.json``.
    """
    document = spec_document()
    if schema_name not in document["$defs"]:  # fail here, not with a reference error later
        raise KeyError(schema_name)
    return Draft202012Validator({**document, "$ref": f"#/$defs/{schema_name}"})


# --- The request fields and rules both endpoints share ------------------------------------------


class StreamAndStopFields:
    """What the legacy and the chat request read alike from ``stream``, ``stream_options`` and ``stop``."""

    stream: bool
    stream_options: dict[str, Any] | None
    stop: str | list[str] | None

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
        return self.stream and bool((self.stream_options or {}).get("include_usage"))

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        """``stop`` as a tuple: ``None`` → ``()``, ``"x"`` → ``("x",)``, a list → a tuple."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def reject_constant(name: str) -> None:
    """``NaN``, ``Infinity`` and ``-Infinity`` are Python's extensions, not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def is_integer(value: Any) -> bool:
    """JSON Schema's ``integer``: an int that is not a bool, or a float with no fraction (``2.0``)."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def check_logit_bias(logit_bias: dict[str, Any]) -> dict[str, int]:
    """``logit_bias`` with int values, once each key is a token id and each value an int in -100..100.

    Raises ``APIError`` 400 for the first bad entry in the client's order: ``invalid_value``
    (``param`` ``logit_bias``) for a key that is not a token id; ``invalid_type`` or
    ``integer_above_max_value``/``integer_below_min_value`` for a value (``param`` ``logit_bias.50256``).
    """
    checked: dict[str, int] = {}
    for key, bias in logit_bias.items():
        if not (key.isascii() and key.isdigit()) or len(key) > MAX_TOKEN_ID_DIGITS:
            why = 'Keys must be token ids: non-negative integers written as strings, e.g. "50256".'
            raise invalid_value_error("logit_bias", key, why=why)
        param = param_path(["logit_bias", key])
        if not is_integer(bias):
            raise invalid_type_error(param, ["an integer"], bias)
        check_range(bias, *LOGIT_BIAS_RANGE, param)
        checked[key] = int(bias)
    return checked


def check_range(value: int, minimum: int, maximum: int, param: str | None) -> None:
    """The schema's bound errors for integer bounds it does not carry (server caps, int64, bias)."""
    if value < minimum:
        raise below_minimum_error(param, minimum, value, integer=True)
    if value > maximum:
        raise above_maximum_error(param, maximum, value, integer=True)


def check_unicode(data: dict[str, Any]) -> None:
    """Reject unpaired surrogates (``"\\ud800"`` is valid JSON but not text); tokenizers fail on them.

    Raises ``APIError`` 400 ``invalid_value`` naming the field.
    """
    for name, value in data.items():
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            message = f"Invalid value for '{name}': a string contains an unpaired UTF-16 surrogate, which is not text."
            raise APIError(message, param=name, code="invalid_value") from None


# --- Errors the views raise ---------------------------------------------------------------------


def body_too_large_error(limit: int) -> APIError:
    """413 for a body over ``limit`` bytes (``settings.API_MAX_BODY_BYTES``), code ``request_too_large``."""
    return APIError(f"The request body is too large: the limit is {limit} bytes.", status=413, code="request_too_large")


def model_not_found_error(model: str) -> APIError:
    """404 for a model this server does not serve, in OpenAI's words, code ``model_not_found``."""
    return APIError(
        f"The model `{shorten(model)}` does not exist or you do not have access to it.",
        status=404,
        param="model",
        code="model_not_found",
    )


# --- Responses ----------------------------------------------------------------------------------


def usage_dict(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    """``CompletionUsage``: ``{"prompt_tokens", "completion_tokens", "total_tokens"}``."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_object(id: str, created: int, owned_by: str, runner: ModelRunnerInfo | None = None) -> Model:
    """``Model``: ``{"id", "object": "model", "created", "owned_by"}``, and our extension ``runner``
    (:class:`~api.types.ModelRunnerInfo`) where given."""
    model: Model = {"id": id, "object": "model", "created": created, "owned_by": owned_by}
    if runner is not None:
        model["runner"] = runner
    return model


def model_list(models: Iterable[Model]) -> ListModelsResponse:
    """``ListModelsResponse``: ``{"object": "list", "data": [model_object(...), ...]}``."""
    return {"object": "list", "data": list(models)}
