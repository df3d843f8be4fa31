"""``response_format``: which outputs a request accepts, and the engine grammar that enforces it.

OpenAI's Chat Completions ``response_format`` (spec: ``ResponseFormatText``,
``ResponseFormatJsonObject``, ``ResponseFormatJsonSchema``) is enforced by grammar-constrained
decoding (:mod:`inference.structured`): ``json_object`` always yields a JSON object, ``json_schema``
a JSON value valid against ``json_schema.schema``; ``strict`` changes nothing here, since the
grammar enforces every schema it compiles.  The same field on ``/v1/completions`` is our
extension (vLLM offers its guided decoding there too); it is checked against the same schemas.
"""

from __future__ import annotations

import asyncio
from functools import cache
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import relevance

from .errors import APIError, schema_error
from .protocol import spec_document

if TYPE_CHECKING:
    from inference.engine import Engine

PARAM = "response_format"


@cache
def _validator() -> Draft202012Validator:
    """``{"response_format": <the chat request's response_format schema>}``, so that errors are
    named ``response_format.json_schema.name`` and the like."""
    document = spec_document()
    chat = document["$defs"]["CreateChatCompletionRequest"]["allOf"][1]["properties"][PARAM]
    schema = {"type": "object", "properties": {PARAM: chat}}
    return Draft202012Validator({**document, **schema})


def check_response_format(value: Any) -> None:
    """Raise ``APIError`` 400 (OpenAI's schema wording, ``param`` under ``response_format``) unless
    ``value`` is one of the spec's three response formats."""
    error = max(_validator().iter_errors({PARAM: value}), key=relevance, default=None)
    if error is not None:
        raise schema_error(error, root=_validator().schema)


def is_constrained(response_format: dict[str, Any] | None) -> bool:
    """Whether ``response_format`` asks for JSON (``json_object`` or ``json_schema``)."""
    return response_format is not None and response_format.get("type") in ("json_object", "json_schema")


def grammar_schema(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema to enforce: ``json_schema.schema`` (``{}``, any JSON, if absent), or None
    for ``json_object`` (any JSON object)."""
    if response_format["type"] == "json_schema":
        return response_format["json_schema"].get("schema") or {}
    return None


async def compile_grammar(engine: Engine, response_format: dict[str, Any] | None) -> Any:
    """The engine grammar for ``response_format`` (None for ``text`` or none), compiled in a thread.

    Raises ``APIError`` 400 ``invalid_value`` naming ``response_format`` when the grammar library
    cannot compile the schema, with the library's reason.
    """
    if response_format is None or not is_constrained(response_format):
        return None
    from inference.structured import GrammarError  # torch and llguidance stay out of import time

    try:
        return await asyncio.to_thread(engine.compile_grammar, grammar_schema(response_format))
    except GrammarError as error:
        raise APIError(
            f"Invalid 'response_format': this server cannot enforce the schema: {str(error)[:300]}",
            param=PARAM,
            code="invalid_value",
        ) from None
