"""Check a JSON body against a schema of OpenAI's spec, as vendored in ``api/openai_schema.json``."""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import best_match

from api.protocol import spec_validator


def validate(schema_name: str, instance: Any) -> None:
    """Pass if ``instance`` is a valid ``schema_name`` (e.g. ``"CreateCompletionResponse"``).

    Raises ``AssertionError`` with jsonschema's message and the path of the most relevant error,
    ``KeyError`` if the spec has no such schema.
    """
    error = best_match(spec_validator(schema_name).iter_errors(instance))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "(root)"
        raise AssertionError(f"not a valid {schema_name} at {where}: {error.message}")
