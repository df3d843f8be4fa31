"""Invalid parameters in OpenAI's words: JSON Schema errors and the rules beyond a schema as ``APIError``.

:func:`schema_error` maps what a jsonschema validator reports to OpenAI's ``code`` and message, and
the builders beside it (``invalid_type_error``, ``above_maximum_error``, ...) say the same for rules a
schema cannot express, so that every 400 reads alike (:mod:`api.errors.shape` is the error itself).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, relevance
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from .shape import APIError

if TYPE_CHECKING:
    from referencing._core import Resolver  # the type of Registry().resolver(); not exported elsewhere


# --- Invalid parameters, in OpenAI's words -------------------------------------------------------
#
# One mapping from what a JSON Schema validator reports (jsonschema's ``ValidationError``: its
# ``validator`` keyword, ``validator_value``, ``instance`` and path) to OpenAI's ``code`` and message,
# for any request schema (completions today, chat tomorrow) and for query parameters (the usage API).
# The rules a schema cannot express use the same builders, so every 400 reads alike.  Wording and
# codes are OpenAI's, as its API answers them (e.g. ``"Invalid 'temperature': decimal above maximum
# value. Expected a value <= 2, but got 2.5 instead."``, code ``decimal_above_max_value``); where
# OpenAI's exact words are unknown (``empty_string``, ``invalid_value`` naming its parameter) they
# follow the same pattern.

MAX_VALUE_CHARS = 200  # a 4 MB prompt must not come back inside an error message

_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a decimal",  # OpenAI's word for JSON numbers
    "string": "a string",
    "boolean": "a boolean",
    "object": "an object",
    "array": "an array",
    "null": "null",
}
_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER
_COMBINATORS = ("anyOf", "oneOf")


def param_path(parts: Iterable[str | int]) -> str | None:
    """OpenAI's ``param`` for a path into the body: names dotted, array indices in brackets.

    ``["stream_options", "include_usage"]`` → ``"stream_options.include_usage"``;
    ``["logit_bias", "50256"]`` → ``"logit_bias.50256"``; ``["stop", 1]`` → ``"stop[1]"``;
    ``[]`` (the body itself) → ``None``.
    """
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or None


def schema_error(error: ValidationError, *, root: Mapping[str, Any] | None = None) -> APIError:
    """The 400 ``APIError`` for one jsonschema ``ValidationError``, with OpenAI's ``code`` and words.

    Works for any schema (not tied to ``CreateCompletionRequest``).  ``param`` is the instance path
    (:func:`param_path`); a missing property names itself.  An ``anyOf``/``oneOf`` error is first
    resolved to the branch the value was meant for (:func:`_branch_error`):

    - a discriminated union, whose branches all pin one property with ``const``/``enum`` (chat
      messages by ``role``, content parts and response formats by ``type``), goes to the branch
      whose values hold the value's (``{"role": "user", "content": null}`` is the user message's
      ``invalid_type`` for ``'messages[0].content'``); a value no branch holds is ``invalid_value``
      listing every branch's values in schema order, a missing one ``missing_required_parameter``;
    - any other union goes to the branch that fits the value's JSON type (``stop: ["a", 5]`` is an
      array, so the array branch's ``"Invalid type for 'stop[1]'..."``); when no branch takes that
      type it is an ``invalid_type`` listing what the branches accept.

    ``root`` is the schema the validator was built from: branches that are ``$ref`` s (the spec's
    are) are looked up in it; without it such a union is told apart by JSON type only.
    Keywords and codes:

    ========================================  ==========================================================
    ``type``, an unmatched ``anyOf/oneOf``    ``invalid_type``
    ``maximum`` / ``exclusiveMaximum``        ``integer_above_max_value`` / ``decimal_above_max_value``
    ``minimum`` / ``exclusiveMinimum``        ``integer_below_min_value`` / ``decimal_below_min_value``
    ``maxItems``                              ``array_above_max_length``
    ``minItems``                              ``empty_array`` (got ``[]``), else ``array_below_min_length``
    ``maxLength``                             ``string_above_max_length``
    ``minLength``                             ``empty_string`` (got ``""``), else ``string_below_min_length``
    ``enum``, ``const``, anything else        ``invalid_value``
    ``required``                              ``missing_required_parameter``
    ``additionalProperties: false``           OpenAI's legacy ``Unrecognized request argument supplied``
    ========================================  ==========================================================

    (integer or decimal follows the schema's ``type``: OpenAI says "decimal" for ``top_p: 5``.)
    """
    error = _branch_error(error, root)
    path = list(error.absolute_path)
    build = _SCHEMA_KEYWORDS.get(error.validator, _other_keyword)
    return build(error, path)


def invalid_type_error(param: str | None, expected: Sequence[str], value: Any) -> APIError:
    """``invalid_type``: ``"Invalid type for 'max_tokens': expected an integer, but got a string instead."``

    ``expected`` are descriptions such as ``"an integer"`` (more than one reads "one of A or B").
    """
    wanted = _one_of(expected) if expected else "another type"
    return APIError(
        f"Invalid type for {_name(param)}: expected {wanted}, but got {json_type_name(value)} instead.",
        param=param,
        code="invalid_type",
    )


def above_maximum_error(
    param: str | None, maximum: float, value: float, *, integer: bool, exclusive: bool = False, why: str = ""
) -> APIError:
    """``integer_above_max_value`` / ``decimal_above_max_value``: ``"Invalid 'n': integer above maximum
    value. Expected a value <= 20, but got 21 instead."``, then ``why`` (a sentence) if given."""
    kind = "integer" if integer else "decimal"
    return APIError(
        f"Invalid {_name(param)}: {kind} above maximum value. Expected a value {'<' if exclusive else '<='} "
        f"{_number_text(maximum)}, but got {_number_text(value)} instead.{_sentence(why)}",
        param=param,
        code=f"{kind}_above_max_value",
    )


def below_minimum_error(
    param: str | None, minimum: float, value: float, *, integer: bool, exclusive: bool = False, why: str = ""
) -> APIError:
    """``integer_below_min_value`` / ``decimal_below_min_value``: ``"Invalid 'n': integer below minimum
    value. Expected a value >= 1, but got 0 instead."``, then ``why`` (a sentence) if given."""
    kind = "integer" if integer else "decimal"
    return APIError(
        f"Invalid {_name(param)}: {kind} below minimum value. Expected a value {'>' if exclusive else '>='} "
        f"{_number_text(minimum)}, but got {_number_text(value)} instead.{_sentence(why)}",
        param=param,
        code=f"{kind}_below_min_value",
    )


def array_too_long_error(param: str | None, maximum: int, length: int) -> APIError:
    """``array_above_max_length``: ``"Invalid 'stop': array too long. Expected an array with maximum
    length 4, but got an array with length 5 instead."``"""
    return APIError(
        f"Invalid {_name(param)}: array too long. Expected an array with maximum length {maximum}, but got an "
        f"array with length {length} instead.",
        param=param,
        code="array_above_max_length",
    )


def array_too_short_error(param: str | None, minimum: int, length: int) -> APIError:
    """``empty_array`` for ``[]`` (``"Invalid 'stop': empty array. Expected an array with minimum length 1,
    but got an empty array instead."``), else ``array_below_min_length`` ("array too short")."""
    if length == 0:
        return APIError(
            f"Invalid {_name(param)}: empty array. Expected an array with minimum length {minimum}, but got an "
            "empty array instead.",
            param=param,
            code="empty_array",
        )
    return APIError(
        f"Invalid {_name(param)}: array too short. Expected an array with minimum length {minimum}, but got an "
        f"array with length {length} instead.",
        param=param,
        code="array_below_min_length",
    )


def string_too_long_error(param: str | None, maximum: int, length: int) -> APIError:
    """``string_above_max_length``: ``"Invalid 'user': string too long. Expected a string with maximum
    length 64, but got a string with length 65 instead."``"""
    return APIError(
        f"Invalid {_name(param)}: string too long. Expected a string with maximum length {maximum}, but got a "
        f"string with length {length} instead.",
        param=param,
        code="string_above_max_length",
    )


def string_too_short_error(param: str | None, minimum: int, length: int) -> APIError:
    """``empty_string`` for ``""`` (``"Invalid 'stop': empty string. Expected a string with minimum length
    1, but got an empty string instead."``), else ``string_below_min_length``."""
    if length == 0:
        return APIError(
            f"Invalid {_name(param)}: empty string. Expected a string with minimum length {minimum}, but got an "
            "empty string instead.",
            param=param,
            code="empty_string",
        )
    return APIError(
        f"Invalid {_name(param)}: string too short. Expected a string with minimum length {minimum}, but got a "
        f"string with length {length} instead.",
        param=param,
        code="string_below_min_length",
    )


def invalid_value_error(param: str | None, value: Any, *, supported: Sequence[Any] = (), why: str = "") -> APIError:
    """``invalid_value``: ``"Invalid value for 'bucket_width': '1w'. Supported values are: '1m', '1h',
    and '1d'."`` (OpenAI's enum message, naming the parameter), or ``why`` instead of the list."""
    message = f"Invalid value for {_name(param)}: {value_text(value)}."
    if supported:
        message += f" Supported values are: {_and_list([value_text(item) for item in supported])}."
    return APIError(message + _sentence(why), param=param, code="invalid_value")


def missing_parameter_error(param: str) -> APIError:
    """``missing_required_parameter``: ``"Missing required parameter: 'prompt'."``"""
    return APIError(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def unrecognized_arguments_error(names: Sequence[str]) -> APIError:
    """Unknown fields, as OpenAI's legacy endpoints answer them: ``"Unrecognized request argument
    supplied: foo"`` (plural ``"arguments"``, names sorted and comma-separated), ``param`` and ``code``
    null (what api.openai.com sends for ``/v1/completions``)."""
    names = sorted(names)
    plural = "s" if len(names) > 1 else ""
    return APIError(f"Unrecognized request argument{plural} supplied: {shorten(', '.join(names))}")


def json_type_name(value: Any) -> str:
    """OpenAI's name for a JSON value's type: ``"a string"``, ``"an integer"``, ``"a decimal"``,
    ``"a boolean"``, ``"an array"``, ``"an object"``, ``"null"``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def value_text(value: Any) -> str:
    """``value`` as an error message quotes it: strings in single quotes, numbers in digits, else JSON;
    cut to ``MAX_VALUE_CHARS``."""
    if isinstance(value, str):
        return f"'{shorten(value)}'"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number_text(value)
    try:
        return shorten(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError):
        return shorten(repr(value))


def schema_types(schema: Mapping[str, Any]) -> list[str]:
    """What ``schema`` accepts, in words, without ``null``: ``["a string", "an array of strings"]``.

    Follows ``anyOf``/``oneOf`` branches; an array with typed ``items`` reads "an array of integers".
    """
    described: list[str] = []
    for branch in (branch for keyword in _COMBINATORS for branch in schema.get(keyword, ())):
        described += schema_types(branch)
    types = schema.get("type", [])
    for name in [types] if isinstance(types, str) else types:
        if name == "array" and isinstance(schema.get("items"), Mapping):
            items = schema_types(schema["items"])
            described.append(f"an array of {_plural(items[0])}" if len(items) == 1 else "an array")
        elif name != "null":
            described.append(_TYPE_NAMES.get(name, name))
    return list(dict.fromkeys(described))


def _branch_error(error: ValidationError, root: Mapping[str, Any] | None = None) -> ValidationError:
    """For ``anyOf``/``oneOf``, the error of the branch the value was meant for, recursively.

    The branches that a discriminator's value picks (:func:`_discriminator`), else those that take
    the value's JSON type.  A discriminator's value that no branch holds becomes an ``enum`` error
    at that property listing every branch's values, and a missing one a ``required`` error for it.
    Stays at the combinator when no branch takes the type (an ``invalid_type`` listing them all),
    or when the chosen branches report nothing (``oneOf`` matched twice).
    """
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(root)) if root is not None else None
    while error.validator in _COMBINATORS and error.context:
        branches = [_resolve(branch, resolver) for branch in error.validator_value]
        name = _discriminator(branches, error.instance, resolver)
        if name is None:
            fitting = {i for i, branch in enumerate(error.validator_value) if _takes_type(branch, error.instance)}
        elif name in error.instance:
            value = error.instance[name]
            pinned = [_pinned_values(branch, name, resolver) or [] for branch in branches]
            fitting = {i for i, values in enumerate(pinned) if any(_same_json(value, each) for each in values)}
            if not fitting:
                supported = _distinct([each for values in pinned for each in values])
                return _error_at(error, [name], "enum", supported, value)
        else:
            fitting = {i for i, branch in enumerate(branches) if name not in branch.get("required", ())}
            if not fitting:
                return _error_at(error, [], "required", [name], error.instance)
        candidates = [sub for sub in error.context if sub.relative_schema_path[0] in fitting]
        if not candidates:
            return error
        error = max(candidates, key=relevance)  # jsonschema's order: shallowest, then strongest keyword
    return error


def _discriminator(branches: Sequence[Any], instance: Any, resolver: Resolver | None) -> str | None:
    """The property every branch pins with ``const``/``enum`` (OpenAPI's ``discriminator``: ``role``
    for chat messages), the first in the first branch's order; None unless ``instance`` is an object
    and every branch is a known object schema."""
    if not isinstance(instance, dict) or not branches or not all(isinstance(b, Mapping) for b in branches):
        return None
    names = branches[0].get("properties", {})
    return next((name for name in names if all(_pinned_values(b, name, resolver) is not None for b in branches)), None)


def _pinned_values(branch: Mapping[str, Any], name: str, resolver: Resolver | None) -> list[Any] | None:
    """The values ``branch`` allows for property ``name`` by ``const`` or ``enum``; None if it pins none."""
    properties = branch.get("properties")
    schema = _resolve(properties.get(name), resolver) if isinstance(properties, Mapping) else None
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _resolve(schema: Any, resolver: Resolver | None) -> Any:
    """``schema``, or what its ``$ref`` names through ``resolver`` (the root schema's, built once per
    error; followed to the end); None when that cannot be found (no resolver, or a reference outside
    the root)."""
    if not (isinstance(schema, Mapping) and "$ref" in schema):
        return schema
    if resolver is None:
        return None
    for _ in range(32):  # a reference chain this long is a loop
        if not (isinstance(schema, Mapping) and "$ref" in schema):
            return schema
        try:
            resolved = resolver.lookup(schema["$ref"])
        except Unresolvable:
            return None
        schema, resolver = resolved.contents, resolved.resolver
    return None


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality: ``1 == 1.0``, but ``true`` is not ``1``."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _distinct(values: Iterable[Any]) -> list[Any]:
    """``values`` without repeats, in order (they may be unhashable: enums can list objects)."""
    kept: list[Any] = []
    for value in values:
        if not any(_same_json(value, seen) for seen in kept):
            kept.append(value)
    return kept


def _error_at(error: ValidationError, below: list[str], keyword: str, expected: Any, instance: Any) -> ValidationError:
    """A ``keyword`` error at ``below`` under ``error``'s place, as if the schema said ``{keyword: expected}``."""
    return ValidationError(
        f"{instance!r} is not valid under {keyword} {expected!r}",
        validator=keyword,
        validator_value=expected,
        instance=instance,
        schema={keyword: expected},
        path=[*error.absolute_path, *below],
    )


def _takes_type(schema: Any, instance: Any) -> bool:
    """Whether ``schema`` (or one of its ``anyOf``/``oneOf`` branches) accepts ``instance``'s JSON type."""
    if not isinstance(schema, Mapping):
        return bool(schema)
    if any(keyword in schema for keyword in _COMBINATORS):
        return any(_takes_type(b, instance) for keyword in _COMBINATORS for b in schema.get(keyword, ()))
    types = schema.get("type")
    if types is None:
        return True
    return any(_TYPE_CHECKER.is_type(instance, name) for name in ([types] if isinstance(types, str) else types))


def _integer_schema(schema: Mapping[str, Any]) -> bool:
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    return "integer" in types and "number" not in types


def _type_keyword(error: ValidationError, path: list) -> APIError:
    return invalid_type_error(
        param_path(path),
        schema_types(error.schema)
        or [
            _TYPE_NAMES.get(t, t)
            for t in ([error.validator_value] if isinstance(error.validator_value, str) else error.validator_value)
        ],
        error.instance,
    )


def _combinator_keyword(error: ValidationError, path: list) -> APIError:
    if not _takes_type(error.schema, error.instance):
        return invalid_type_error(param_path(path), schema_types(error.schema), error.instance)
    # The value's type fits, but no branch (or, for oneOf, more than one) takes the whole value.
    return invalid_value_error(param_path(path), error.instance, why="It does not match any of the allowed forms.")


def _maximum_keyword(error: ValidationError, path: list) -> APIError:
    return above_maximum_error(
        param_path(path),
        error.validator_value,
        error.instance,
        integer=_integer_schema(error.schema),
        exclusive=error.validator == "exclusiveMaximum",
    )


def _minimum_keyword(error: ValidationError, path: list) -> APIError:
    return below_minimum_error(
        param_path(path),
        error.validator_value,
        error.instance,
        integer=_integer_schema(error.schema),
        exclusive=error.validator == "exclusiveMinimum",
    )


def _required_keyword(error: ValidationError, path: list) -> APIError:
    missing = next(name for name in error.validator_value if name not in error.instance)
    return missing_parameter_error(param_path([*path, missing]) or missing)


def _enum_keyword(error: ValidationError, path: list) -> APIError:
    supported = error.validator_value if error.validator == "enum" else [error.validator_value]
    return invalid_value_error(param_path(path), error.instance, supported=supported)


def _additional_properties_keyword(error: ValidationError, path: list) -> APIError:
    known = set(error.schema.get("properties", ()))
    extra = [name for name in error.instance if name not in known]
    return unrecognized_arguments_error([param_path([*path, name]) or name for name in extra])


def _other_keyword(error: ValidationError, path: list) -> APIError:
    return invalid_value_error(param_path(path), error.instance, why=shorten(error.message))


_SCHEMA_KEYWORDS: dict[str, Callable[[ValidationError, list], APIError]] = {
    "type": _type_keyword,
    "anyOf": _combinator_keyword,
    "oneOf": _combinator_keyword,
    "maximum": _maximum_keyword,
    "exclusiveMaximum": _maximum_keyword,
    "minimum": _minimum_keyword,
    "exclusiveMinimum": _minimum_keyword,
    "maxItems": lambda error, path: array_too_long_error(param_path(path), error.validator_value, len(error.instance)),
    "minItems": lambda error, path: array_too_short_error(param_path(path), error.validator_value, len(error.instance)),
    "maxLength": lambda error, path: string_too_long_error(
        param_path(path), error.validator_value, len(error.instance)
    ),
    "minLength": lambda error, path: string_too_short_error(
        param_path(path), error.validator_value, len(error.instance)
    ),
    "enum": _enum_keyword,
    "const": _enum_keyword,
    "required": _required_keyword,
    "additionalProperties": _additional_properties_keyword,
}


def _name(param: str | None) -> str:
    return f"'{param}'" if param else "the request body"


def _one_of(expected: Sequence[str]) -> str:
    if len(expected) == 1:
        return expected[0]
    return "one of " + _and_list(expected, conjunction="or")


def _and_list(items: Sequence[str], conjunction: str = "and") -> str:
    if len(items) <= 2:
        return f" {conjunction} ".join(items)
    return ", ".join(items[:-1]) + f", {conjunction} {items[-1]}"


def _plural(description: str) -> str:
    """``"an integer"`` → ``"integers"``, ``"an array of integers"`` → ``"arrays of integers"``."""
    words = description.split(" ")
    if words[0] in ("a", "an"):
        words = words[1:]
    words[0] += "s"
    return " ".join(words)


def _sentence(text: str) -> str:
    return f" {text}" if text else ""


def _number_text(value: float) -> str:
    """Digits, shortened; an integer too long for ``str`` (over Python's 4300 digits) by its size."""
    try:
        return shorten(repr(value) if isinstance(value, float) else str(value))
    except ValueError:  # only an int can be too long for str()
        return f"a {int(value).bit_length()}-bit integer"


def shorten(text: str) -> str:
    """``text`` cut to ``MAX_VALUE_CHARS`` characters, with ``...`` where it was cut."""
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "..."
