"""Every rule of the request schema that a request can break gets OpenAI's ``code``, ``param`` and words.

The rules are found by walking the vendored ``CreateCompletionRequest`` (``inference/openai_schema.json``),
not listed by hand: every ``type``, ``minimum``, ``maximum``, ``minItems``, ``maxItems``, ``minLength``,
``maxLength``, ``enum`` and ``required``, inside ``anyOf``/``oneOf`` branches, array items, nested
objects and maps too.  For each one the walk builds a request breaking only that rule (a rule that a
sibling branch still satisfies, such as the ``enum`` beside a plain string for ``model``, cannot be
broken alone: the spec's own validator must call the request invalid, or the rule is set aside) and
sends it to the real views, streamed and not: a 400 with the expected code, the param, a message
quoting the param, as plain JSON (a stream never started).  The same walk over a schema of another
shape (a chat-like one with ``maxLength``, ``enum`` and nested ``required``) checks the mapping is not
tied to the completion schema.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import relevance

from api.errors import schema_error
from api.protocol import SCHEMA_PATH
from tests.inprocess_api import MODEL, post
from tests.openai_schema import validate

SPEC = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
BASE = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
BOUNDS = ("minimum", "maximum", "minItems", "maxItems", "minLength", "maxLength", "enum")
# Values of every JSON type but null (null means "the default" for an optional field).
SAMPLES = ["x", 7, 1.5, True, {"x": 1}, ["x"]]
JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object", list: "array"}


@dataclass(frozen=True)
class Rule:
    keyword: str  # the schema keyword, or "type" for the type (union) at a place
    path: tuple[str | int, ...]  # where in the request: ("stop",), ("prompt", 0, 0), ("logit_bias", "1")
    schema: dict  # the schema holding the keyword

    @property
    def id(self) -> str:
        return f"{self.keyword}:{param(self.path)}"


def param(path: tuple) -> str:
    """The param OpenAI names: ``logit_bias.1``, ``prompt[0][0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def resolve(schema: dict, document: dict) -> dict:
    while "$ref" in schema:
        schema = document["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def walk(schema: dict, document: dict, path: tuple = ()) -> Iterator[Rule]:
    """Every breakable-looking rule under ``schema``, at its place in the instance."""
    schema = resolve(schema, document)
    if path and ("type" in schema or "anyOf" in schema or "oneOf" in schema):
        yield Rule("type", path, schema)
    for keyword in BOUNDS:
        if keyword in schema:
            yield Rule(keyword, path, schema)
    for name in schema.get("required", ()):
        yield Rule("required", (*path, name), schema)
    for keyword in ("anyOf", "oneOf"):
        for branch in schema.get(keyword, ()):
            yield from walk(branch, document, path)
    for name, sub in schema.get("properties", {}).items():
        yield from walk(sub, document, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], document, (*path, 0))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], document, (*path, "1"))


def types_of(schema: dict, document: dict) -> set[str]:
    schema = resolve(schema, document)
    found = set()
    for keyword in ("anyOf", "oneOf"):
        for branch in schema.get(keyword, ()):
            found |= types_of(branch, document)
    kinds = schema.get("type", [])
    found |= {kinds} if isinstance(kinds, str) else set(kinds)
    return found


def json_type(value: Any) -> set[str]:
    kind = JSON_TYPES[type(value)]
    return {"integer", "number"} if kind == "integer" else {kind}


def breaking_values(rule: Rule, document: dict) -> Iterator[Any]:
    """Values that break ``rule`` at its place (several for a type, to find one no branch accepts)."""
    schema, keyword = rule.schema, rule.keyword
    integer = "integer" in types_of(schema, document)
    step = 1 if integer else 0.5
    if keyword == "type":
        accepted = types_of(schema, document)
        yield from (value for value in SAMPLES if not json_type(value) & accepted)
    elif keyword == "minimum":
        yield schema["minimum"] - step
    elif keyword == "maximum":
        yield schema["maximum"] + step
    elif keyword in ("minItems", "maxItems"):
        length = schema[keyword] - 1 if keyword == "minItems" else schema[keyword] + 1
        yield [valid_item(schema, document)] * length
    elif keyword in ("minLength", "maxLength"):
        yield "x" * (schema[keyword] - 1 if keyword == "minLength" else schema[keyword] + 1)
    elif keyword == "enum":
        yield "not-" + str(schema["enum"][0])


def valid_item(schema: dict, document: dict) -> Any:
    items = resolve(schema.get("items", {}), document)
    return {"string": "x", "integer": 1, "number": 0.5, "boolean": True, "array": [1]}.get(
        next(iter(types_of(items, document) - {"null"}), "string"), "x"
    )


def place(request: dict, path: tuple, value: Any) -> dict:
    """``request`` with ``value`` at ``path`` (containers made as needed), or without it for ``None``."""
    request = copy.deepcopy(request)
    if value is None:
        holder = request
        for part in path[:-1]:
            holder = holder[part]
        holder.pop(path[-1], None)
        return request
    holder: Any = request
    for part, following in zip(path, (*path[1:], None)):
        if following is None:
            break
        fresh = [None] if isinstance(following, int) else {}
        if isinstance(holder, list):
            holder[part] = holder[part] if isinstance(holder[part], (list, dict)) else fresh
        else:
            holder[part] = holder.get(part) if isinstance(holder.get(part), (list, dict)) else fresh
        holder = holder[part]
    holder[path[-1]] = value
    return request


def expected_code(rule: Rule, value: Any, document: dict) -> str:
    kind = "integer" if types_of(rule.schema, document) & {"integer"} else "decimal"
    return {
        "type": "invalid_type",
        "minimum": f"{kind}_below_min_value",
        "maximum": f"{kind}_above_max_value",
        "maxItems": "array_above_max_length",
        "minItems": "empty_array" if value == [] else "array_below_min_length",
        "maxLength": "string_above_max_length",
        "minLength": "empty_string" if value == "" else "string_below_min_length",
        "enum": "invalid_value",
        "required": "missing_required_parameter",
    }[rule.keyword]


@dataclass(frozen=True)
class Case:
    rule: Rule
    request: dict
    code: str


def cases(schema_name: str, base: dict, document: dict) -> tuple[list[Case], list[Rule]]:
    """One request per rule that can be broken alone, and the rules that cannot.

    A union's branches repeat its place's ``type`` rule; a request already built is not sent twice.
    """
    spec = Draft202012Validator({**document, "$ref": f"#/$defs/{schema_name}"})
    found: dict[tuple[str, str], Case] = {}
    unbreakable: dict[str, Rule] = {}
    for rule in walk(document["$defs"][schema_name], document):
        values = [None] if rule.keyword == "required" else breaking_values(rule, document)
        for value in values:
            request = place(base, rule.path, value)
            if not spec.is_valid(request):
                found.setdefault(
                    (rule.id, json.dumps(request)), Case(rule, request, expected_code(rule, value, document))
                )
                break
        else:
            unbreakable[rule.id] = rule
    return list(found.values()), list(unbreakable.values())


COMPLETION_CASES, COMPLETION_UNBREAKABLE = cases("CreateCompletionRequest", BASE, SPEC)


def test_the_walk_finds_every_kind_of_rule_in_the_completion_schema() -> None:
    kinds = {case.rule.keyword for case in COMPLETION_CASES}
    assert len(COMPLETION_CASES) >= 40
    assert kinds == {"type", "minimum", "maximum", "minItems", "maxItems", "required"}
    assert {
        "maxItems:stop",
        "minItems:stop",
        "required:model",
        "required:prompt",
        "maximum:temperature",
        "type:logit_bias.1",
        "type:stream_options.include_usage",
        "minItems:prompt[0]",
    } <= {case.rule.id for case in COMPLETION_CASES}
    # What stays unbroken is covered by a sibling branch: model's enum beside any string, and the
    # prompt forms' minItems (an empty list is a valid array of strings; we refuse it, see
    # test_request_validation).  The schema has no maxLength, minLength or breakable enum: the
    # chat-like schema below has them.
    assert {rule.id for rule in COMPLETION_UNBREAKABLE} == {"enum:model", "minItems:prompt"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", COMPLETION_CASES, ids=[case.rule.id for case in COMPLETION_CASES])
def test_a_broken_rule_is_a_400_with_openais_code_naming_the_param(tiny_api, valid_key, case, stream) -> None:
    if stream and case.rule.path[0] == "stream":
        pytest.skip("the stream variant would overwrite the broken rule")
    request = {**case.request, "stream": True} if stream else case.request

    reply = post(valid_key.plaintext, request)

    assert reply.status == 400, reply
    assert reply.headers["content-type"] == "application/json" and not reply.events  # before any byte
    validate("ErrorResponse", reply.body)
    error = reply.error
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", case.code, param(case.rule.path))
    assert f"'{param(case.rule.path)}'" in error["message"]


# --- The same mapping on a schema of another shape (what a chat endpoint would bring) ---------------

CHAT_LIKE = {
    "$defs": {
        "Message": {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"type": "string", "enum": ["system", "user", "assistant"]},
                "content": {"type": "string", "minLength": 1, "maxLength": 20},
                "name": {"type": "string", "maxLength": 8},
            },
        },
        "ChatLikeRequest": {
            "type": "object",
            "required": ["model", "messages"],
            "properties": {
                "model": {"type": "string"},
                "messages": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"$ref": "#/$defs/Message"}},
                "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
                "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
                "tags": {"type": "array", "items": {"type": "string"}},
                "pair": {"type": "array", "minItems": 2, "maxItems": 2},
                "reasoning_effort": {"type": "string", "enum": ["low", "medium", "high"]},
            },
        },
    }
}
CHAT_BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHAT_CASES, CHAT_UNBREAKABLE = cases("ChatLikeRequest", CHAT_BASE, CHAT_LIKE)


def test_the_walk_finds_every_kind_of_rule_in_another_schema() -> None:
    assert {case.rule.keyword for case in CHAT_CASES} == {
        "type",
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "enum",
        "required",
    }
    assert not CHAT_UNBREAKABLE


@pytest.mark.parametrize("case", CHAT_CASES, ids=[case.rule.id for case in CHAT_CASES])
def test_the_mapping_is_not_tied_to_the_completion_schema(case) -> None:
    validator = Draft202012Validator({**CHAT_LIKE, "$ref": "#/$defs/ChatLikeRequest"})

    error = schema_error(max(validator.iter_errors(case.request), key=relevance))

    assert (error.status, error.code, error.param) == (400, case.code, param(case.rule.path))
    assert f"'{param(case.rule.path)}'" in error.message


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            {**CHAT_BASE, "messages": [{"role": "user", "content": "x" * 21}]},
            (
                "Invalid 'messages[0].content': string too long. Expected a string with maximum length 20, "
                "but got a string with length 21 instead."
            ),
        ),
        (
            {**CHAT_BASE, "messages": [{"role": "robot", "content": "hi"}]},
            "Invalid value for 'messages[0].role': 'robot'. Supported values are: 'system', 'user', and 'assistant'.",
        ),
        ({**CHAT_BASE, "messages": [{"role": "user"}]}, "Missing required parameter: 'messages[0].content'."),
        (
            {**CHAT_BASE, "messages": []},
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        ),
        (
            {**CHAT_BASE, "pair": ["a"]},
            (
                "Invalid 'pair': array too short. Expected an array with minimum length 2, but got an array with "
                "length 1 instead."
            ),
        ),
        (
            {**CHAT_BASE, "temperature": "hot"},
            "Invalid type for 'temperature': expected a decimal, but got a string instead.",
        ),
    ],
    ids=["maxLength", "enum", "nested_required", "empty_array", "minItems", "type"],
)
def test_messages_read_like_openais(request_, message) -> None:
    validator = Draft202012Validator({**CHAT_LIKE, "$ref": "#/$defs/ChatLikeRequest"})

    assert schema_error(max(validator.iter_errors(request_), key=relevance)).message == message


# --- A discriminated union: its branches told apart by one pinned property, not by JSON type ------
#
# Every branch is an object, so the JSON type cannot choose; the property each branch pins with
# ``const`` or ``enum`` (OpenAI's chat messages pin ``role``) does.  The same shapes with ``$ref``
# branches (looked up in the validator's root schema, as the spec's are) and with inline ones.

CIRCLE = {
    "type": "object",
    "required": ["shape", "radius"],
    "properties": {"shape": {"const": "circle"}, "radius": {"type": "number"}},
}
SQUARE = {
    "type": "object",
    "required": ["shape", "side"],
    "properties": {"shape": {"type": "string", "enum": ["square"]}, "side": {"type": "number"}},
}
TAGGED_BY_REF = {
    "$defs": {"Circle": CIRCLE, "Square": SQUARE},
    "type": "object",
    "properties": {"figure": {"oneOf": [{"$ref": "#/$defs/Circle"}, {"$ref": "#/$defs/Square"}]}},
}
TAGGED_INLINE = {"type": "object", "properties": {"figure": {"anyOf": [CIRCLE, SQUARE]}}}


@pytest.mark.parametrize(
    ("schema", "root"), [(TAGGED_BY_REF, TAGGED_BY_REF), (TAGGED_INLINE, None)], ids=["ref_branches", "inline_branches"]
)
@pytest.mark.parametrize(
    ("figure", "code", "param_", "message"),
    [
        (
            {"shape": "square", "radius": 1},
            "missing_required_parameter",
            "figure.side",
            "Missing required parameter: 'figure.side'.",
        ),
        (
            {"shape": "circle", "radius": "big"},
            "invalid_type",
            "figure.radius",
            "Invalid type for 'figure.radius': expected a decimal, but got a string instead.",
        ),
        (
            {"shape": "hexagon", "side": 1},
            "invalid_value",
            "figure.shape",
            "Invalid value for 'figure.shape': 'hexagon'. Supported values are: 'circle' and 'square'.",
        ),
        (
            {"shape": 4, "side": 1},
            "invalid_value",
            "figure.shape",
            "Invalid value for 'figure.shape': 4. Supported values are: 'circle' and 'square'.",
        ),
        ({"side": 1}, "missing_required_parameter", "figure.shape", "Missing required parameter: 'figure.shape'."),
        (
            "square",
            "invalid_type",
            "figure",
            "Invalid type for 'figure': expected an object, but got a string instead.",
        ),
    ],
    ids=["other_branchs_field", "wrong_type_in_the_branch", "unknown_tag", "tag_not_a_string", "no_tag", "not_object"],
)
def test_a_discriminated_union_reports_the_branch_its_tag_names(schema, root, figure, code, param_, message) -> None:
    validator = Draft202012Validator(schema)

    error = schema_error(max(validator.iter_errors({"figure": figure}), key=relevance), root=root)

    assert (error.status, error.code, error.param, error.message) == (400, code, param_, message)


def test_a_union_with_an_unpinned_branch_still_goes_by_json_type() -> None:
    """A branch without the pinned property (here ``null``) means no discriminator: the old rule holds."""
    schema = {"type": "object", "properties": {"figure": {"anyOf": [CIRCLE, {"type": "null"}]}}}
    validator = Draft202012Validator(schema)

    error = schema_error(max(validator.iter_errors({"figure": {"shape": "circle"}}), key=relevance))

    assert (error.code, error.param) == ("missing_required_parameter", "figure.radius")
