"""OpenAI's error shape for every Administration API error: one DRF exception handler.

Every error is ``{"error": {"message", "type", "param", "code"}}`` (``api.errors``).  What the views
and the authentication raise as :class:`~api.errors.APIError` is answered as it is; DRF's own
exceptions are translated:

=====================================  ===========================================================
``ValidationError`` of a request body  400 naming the first bad field in ``param``, with
                                       ``api.errors``' codes and words (:func:`validation_error`)
``ParseError`` (a body that is not     400, OpenAI's "We could not parse the JSON body of your
JSON)                                  request."
``NotFound`` / ``Http404``             404 ``invalid_request_error``
``MethodNotAllowed``                   405 OpenAI's "Invalid URL (METHOD /path)"
Django's ``RequestDataTooBig`` (a      413 ``request_too_large``, as ``/v1/completions`` answers
body over                              it (``api.protocol.body_too_large_error``), not Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE``)       400 naming its setting
``NotAuthenticated``, ...              their status with DRF's message
=====================================  ===========================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, fields, serializers
from rest_framework.response import Response

from api.errors import (
    APIError,
    above_maximum_error,
    array_too_long_error,
    below_minimum_error,
    invalid_type_error,
    invalid_value_error,
    missing_parameter_error,
    param_path,
    string_too_long_error,
    string_too_short_error,
)
from api.protocol import body_too_large_error

JSON_PARSE_MESSAGE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP "
    "library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)"
)
_NO_VALUE = object()


def openai_exception_handler(exc: Exception, context: Mapping[str, Any]) -> Response | None:
    """DRF's ``EXCEPTION_HANDLER``: the response in OpenAI's shape, ``None`` for what is no API error (a 500)."""
    error = as_api_error(exc, context.get("request"))
    if error is None:
        return None
    return Response(error.to_dict(), status=error.status, headers=error.headers or None)


def as_api_error(exc: Exception, request: Any = None) -> APIError | None:
    """The :class:`APIError` that ``exc`` stands for, or ``None`` for an unexpected exception."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestDataTooBig):
        return body_too_large_error(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    if isinstance(exc, Http404):
        return APIError(str(exc) or "Not found.", status=404)
    if isinstance(exc, exceptions.ValidationError):
        data = getattr(request, "data", None) if request is not None else None
        return validation_error(exc.detail, data)
    if isinstance(exc, exceptions.ParseError):
        return APIError(JSON_PARSE_MESSAGE, status=400)
    if isinstance(exc, exceptions.MethodNotAllowed) and request is not None:
        return APIError(f"Invalid URL ({request.method} {request.path})", status=405)
    if isinstance(exc, exceptions.APIException):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return APIError(_first_message(exc.detail), status=exc.status_code, headers=headers)
    return None


def validation_error(
    detail: Any, data: Any, serializer: serializers.Serializer | None = None, prefix: Sequence[str | int] = ()
) -> APIError:
    """The 400 for the first error of a DRF ``ValidationError.detail``, naming its field in ``param``.

    ``data`` is the request's body, for the offending value; ``serializer`` (when known) tells the
    field's type and bounds.  DRF's codes become ``api.errors``':

    ===============================  ========================================================
    ``required``                     ``missing_required_parameter``
    ``null``, ``not_a_list``, and    ``invalid_type`` ("expected an integer, but got a
    ``invalid`` of another type      string instead")
    ``max_value`` / ``min_value``    ``integer_above_max_value`` / ``integer_below_min_value``
    ``max_length``                   ``string_above_max_length`` (``array_...`` for lists)
    ``blank``                        ``empty_string``
    ``invalid_choice``, the rest     ``invalid_value`` (the supported values, or DRF's message)
    ===============================  ========================================================
    """
    path, error = _first_error(detail, list(prefix))
    param = param_path(path)
    field = _field_at(serializer, path[len(prefix) :]) if serializer is not None else None
    value = _value_at(data, path)
    code = getattr(error, "code", None)
    if code == "required":
        return missing_parameter_error(param or "body")
    shown = None if value is _NO_VALUE else value
    wrong_type = code in ("null", "not_a_list", "not_a_dict") or (code == "invalid" and not _takes(field, shown))
    if wrong_type:
        return invalid_type_error(param, [_type_name(field)], shown)
    if code == "max_value" and field is not None and isinstance(shown, int):
        return above_maximum_error(param, field.max_value, shown, integer=True)
    if code == "min_value" and field is not None and isinstance(shown, int):
        return below_minimum_error(param, field.min_value, shown, integer=True)
    if code == "max_length" and field is not None and isinstance(shown, str):
        return string_too_long_error(param, field.max_length, len(shown))
    if code == "max_length" and field is not None and isinstance(shown, list):
        return array_too_long_error(param, field.max_length, len(shown))
    if code == "blank":
        return string_too_short_error(param, 1, 0)
    if code == "invalid_choice" and isinstance(field, fields.ChoiceField):
        return invalid_value_error(param, shown, supported=list(field.choices))
    return invalid_value_error(param, shown, why=str(error))


def _first_error(detail: Any, path: list[str | int]) -> tuple[list[str | int], Any]:
    """The path and ``ErrorDetail`` of the first error in a nested ``detail`` (dicts, lists)."""
    if isinstance(detail, Mapping):
        for key, value in detail.items():
            if value:
                sub = [] if key == "non_field_errors" else [int(key) if isinstance(key, int) else key]
                return _first_error(value, path + sub)
    if isinstance(detail, list):
        for index, value in enumerate(detail):
            if isinstance(value, (Mapping, list)) and value:
                # A list of errors is one field's; a list of dicts/lists is per item.
                return _first_error(value, [*path, index])
            if value:
                return path, value
    return path, detail


def _field_at(serializer: Any, path: Sequence[str | int]) -> Any:
    field = serializer
    for part in path:
        if isinstance(part, int):
            field = getattr(field, "child", None)
        else:
            field = getattr(field, "fields", {}).get(part)
        if field is None:
            return None
    return field


def _value_at(data: Any, path: Sequence[str | int]) -> Any:
    value = data
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return _NO_VALUE
    return value


def _type_name(field: Any) -> str:
    """OpenAI's name of what ``field`` takes: ``"an integer"``, ``"a string"``, ``"an array"``, ..."""
    if isinstance(field, fields.BooleanField):
        return "a boolean"
    if isinstance(field, fields.IntegerField):
        return "an integer"
    if isinstance(field, (fields.ListField, serializers.ListSerializer)):
        return "an array"
    if isinstance(field, (fields.DictField, serializers.Serializer)):
        return "an object"
    return "a string"


def _takes(field: Any, value: Any) -> bool:
    """Whether ``value``'s JSON type is the one ``field`` takes (then an ``invalid`` is a bad value)."""
    expected = {
        "a boolean": (bool,),
        "an integer": (int,),
        "an array": (list,),
        "an object": (dict,),
        "a string": (str,),
    }[_type_name(field)]
    return isinstance(value, expected) and not (isinstance(value, bool) and bool not in expected)


def _first_message(detail: Any) -> str:
    if isinstance(detail, Mapping):
        detail = next(iter(detail.values()), "")
    if isinstance(detail, list):
        detail = detail[0] if detail else ""
    return str(detail)
