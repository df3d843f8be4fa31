"""OpenAI's errors, for the API's views and the Administration API (``organization``) alike.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}``:
:mod:`~api.errors.shape` is the exception and its response, :mod:`~api.errors.schema` the translation
of JSON Schema errors (and of the rules beyond a schema) into OpenAI's codes and words.  The names
below are the package's interface; neither module imports anything else of ``api``.
"""

from __future__ import annotations

from .schema import (
    MAX_VALUE_CHARS,
    above_maximum_error,
    array_too_long_error,
    array_too_short_error,
    below_minimum_error,
    invalid_type_error,
    invalid_value_error,
    json_type_name,
    missing_parameter_error,
    param_path,
    schema_error,
    schema_types,
    shorten,
    string_too_long_error,
    string_too_short_error,
    unrecognized_arguments_error,
    value_text,
)
from .shape import APIError, error_response

__all__ = [
    "MAX_VALUE_CHARS",
    "APIError",
    "above_maximum_error",
    "array_too_long_error",
    "array_too_short_error",
    "below_minimum_error",
    "error_response",
    "invalid_type_error",
    "invalid_value_error",
    "json_type_name",
    "missing_parameter_error",
    "param_path",
    "schema_error",
    "schema_types",
    "shorten",
    "string_too_long_error",
    "string_too_short_error",
    "unrecognized_arguments_error",
    "value_text",
]
