"""Query strings as JSON for a schema: the usage APIs' and the audit log's parameters.

OpenAI's clients send array parameters with brackets (``group_by[]=model``) and objects as
``name[key]=value`` (``effective_at[gt]=...``); people write them repeated or comma-separated.
:func:`query_instance` turns a query string into the JSON object that a JSON Schema of the
parameters checks, so a bad parameter gets the same ``code`` and words as a bad request body
(:func:`validate_query`, through :func:`api.errors.schema_error`).  A parameter the schema does not
name is a 400 too, never silently ignored (:func:`refuse_unknown`), as an unknown body field is.
"""

from __future__ import annotations

import re
from typing import Any

from django.http import QueryDict
from jsonschema import Draft202012Validator
from jsonschema.exceptions import relevance

from .errors import APIError, invalid_value_error, schema_error, unrecognized_arguments_error

_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")  # longer is no time or limit of ours, and int() of it is slow
_MEMBER = re.compile(r"(?P<name>[^\[\]]+)\[(?P<key>[^\[\]]*)\]")  # group_by[], effective_at[gt]


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


def refuse_unknown(
    params: QueryDict, schema: dict[str, Any], *, also: tuple[str, ...] = (), unsupported: dict[str, str] | None = None
) -> None:
    """400 for a parameter that :func:`query_instance` would not read, as bodies answer an unknown field.

    Known: the schema's properties as :func:`query_instance` reads them (an array as ``name`` or
    ``name[]``, an object as ``name[key]`` for its keys, anything else as ``name``), and the names in
    ``also`` (read elsewhere, e.g. a list's ``after``).  A name in ``unsupported`` (a parameter of
    OpenAI's that this server does not do, mapped to why) is ``unsupported_parameter`` naming it;
    any other is OpenAI's "Unrecognized request argument supplied: NAME" (``param`` and ``code`` null).
    """
    unknown = []
    for name in params:
        if name in also or _reads(name, schema):
            continue
        member = _MEMBER.fullmatch(name)
        base = member["name"] if member else name
        if unsupported and base in unsupported:
            raise APIError(
                f"Unsupported parameter: '{base}' is not supported by this server: {unsupported[base]}",
                param=base,
                code="unsupported_parameter",
            )
        unknown.append(name)
    if unknown:
        raise unrecognized_arguments_error(unknown)


def _reads(name: str, schema: dict[str, Any]) -> bool:
    """Whether :func:`query_instance` reads the query parameter ``name`` for ``schema``."""
    properties = schema["properties"]
    member = _MEMBER.fullmatch(name)
    if member is None:
        return name in properties and properties[name].get("type") != "object"
    prop = properties.get(member["name"], {})
    if prop.get("type") == "array":
        return member["key"] == ""
    return prop.get("type") == "object" and member["key"] in prop.get("properties", {})


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
