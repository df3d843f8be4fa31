"""Query strings as JSON for a schema: the usage APIs' and the audit log's parameters.

OpenAI's clients send array parameters with brackets (``group_by[]=model``) and objects as
``name[key]=value`` (``effective_at[gt]=...``); people write them repeated or comma-separated.
:func:`query_instance` turns a query string into the JSON object that a JSON Schema of the
parameters checks, so a bad parameter gets the same ``code`` and words as a bad request body
(:func:`validate_query`, through :func:`api.errors.schema_error`).
"""

from __future__ import annotations

import re
from typing import Any

from django.http import QueryDict
from jsonschema import Draft202012Validator
from jsonschema.exceptions import relevance

from .errors import invalid_value_error, schema_error

_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")  # longer is no time or limit of ours, and int() of it is slow


def query_instance(params: QueryDict, schema: dict[str, Any]) -> dict[str, Any]:
    """The query string as the JSON ``schema`` checks, guided by the schema's property types.

    ``integer`` properties: digits become integers (anything else stays a string, for the schema to
    call an ``invalid_type``).  ``array`` properties: see :func:`array_values`.  ``object``
    properties: ``name[key]=value`` pairs, each value read by the type of ``key``'s schema.
    Empty values are left out.
    """
    for name, values in params.lists():
        bad = next((value for value in values if "\x00" in value), None)
        if bad is not None:  # PostgreSQL refuses NUL in a query's strings (a 500); no value of ours has one
            raise invalid_value_error(name.removesuffix("[]"), bad, why="Null characters are not allowed.")
    query: dict[str, Any] = {}
    for name, prop in schema["properties"].items():
        kind = prop.get("type")
        if kind == "array":
            values = array_values(params, name)
            if values:
                query[name] = values
        elif kind == "object":
            members = {
                key: _scalar(params.get(f"{name}[{key}]"), sub.get("type"))
                for key, sub in prop.get("properties", {}).items()
                if params.get(f"{name}[{key}]") not in (None, "")
            }
            if members:
                query[name] = members
        elif params.get(name) not in (None, ""):
            query[name] = _scalar(params.get(name), kind)
    return query


def validate_query(query: dict[str, Any], validator: Draft202012Validator) -> None:
    """Raise the most relevant schema error as OpenAI's 400 (``APIError``); nothing if ``query`` is valid."""
    error = max(validator.iter_errors(query), key=relevance, default=None)
    if error is not None:
        raise schema_error(error)


def array_values(params: QueryDict, name: str) -> list[str]:
    """Values of an array parameter: repeated, with ``[]`` brackets, or comma-separated."""
    values = params.getlist(name) + params.getlist(f"{name}[]")
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _scalar(raw: Any, kind: str | None) -> Any:
    return int(raw) if kind == "integer" and _INTEGER.fullmatch(raw) else raw
