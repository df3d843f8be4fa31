"""OpenAI's error shape and the translation of JSON Schema errors into it, for ``api`` and ``organization``.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from .schema import (
    MAX_VALUE_CHARS,
    APIError,
    above_maximum_error,
    array_too_long_error,
    array_too_short_error,
    below_minimum_error,
    error_response,
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
