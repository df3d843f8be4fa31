"""Vendor the Completions, Chat Completions and Models schemas of OpenAI's OpenAPI spec as plain JSON Schema 2020-12.

Usage (from the repository root)::

    .venv/bin/python tools/vendor_openai_schema.py [path/to/openai-openapi.yaml]

The default input is ``../shared/openai-openapi.yaml``; the output is ``api/openai_schema.json``,
which is committed so that a machine without the spec still validates requests and tests.

The spec is OpenAPI 3.1 but still writes ``nullable: true`` (an OpenAPI 3.0 keyword that JSON Schema
2020-12 ignores), so each schema is rewritten:

- ``nullable: true`` becomes an explicit null: ``"type": "integer"`` → ``["integer", "null"]`` (plus
  ``null`` in an ``enum``); a schema without ``type`` (``oneOf``, ``anyOf``, ``$ref``) becomes
  ``{"anyOf": [<schema>, {"type": "null"}]}``.
- ``$ref: '#/components/schemas/X'`` becomes ``#/$defs/X``; every schema reached through a ``$ref``
  is vendored too.
- Documentation (``description``, ``example(s)``, ``title``, ``x-*`` extensions) is dropped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO_ROOT / ".." / "shared" / "openai-openapi.yaml"
OUTPUT = REPO_ROOT / "api" / "openai_schema.json"

# The schemas the service speaks; whatever they reference comes along.
ROOTS = (
    "CreateCompletionRequest",
    "CreateCompletionResponse",
    "CompletionUsage",
    "Error",
    "ErrorResponse",
    "ChatCompletionStreamOptions",
    "StopConfiguration",
    "Model",
    "ListModelsResponse",
    "CreateChatCompletionRequest",
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "ChatCompletionTokenLogprob",
)

OPENAPI_REF_PREFIX = "#/components/schemas/"
DROPPED_KEYS = {"description", "example", "examples", "title", "externalDocs", "nullable"}
# Keywords whose value is one subschema, a list of subschemas, or a name → subschema map.
# Everything else is copied as it is, so a property *named* "description" survives.
SUBSCHEMA = {"items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else"}
SUBSCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}
SUBSCHEMA_MAPS = {"properties", "patternProperties", "$defs", "dependentSchemas"}


def convert(schema: Any) -> Any:
    """One OpenAPI schema object as JSON Schema 2020-12 (see the module docstring for the rules)."""
    if not isinstance(schema, dict):
        return schema  # ``additionalProperties: true`` and the like
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in DROPPED_KEYS or key.startswith("x-"):
            continue
        if key == "$ref":
            out[key] = "#/$defs/" + value.removeprefix(OPENAPI_REF_PREFIX)
        elif key in SUBSCHEMA:
            out[key] = convert(value)
        elif key in SUBSCHEMA_LISTS:
            out[key] = [convert(item) for item in value]
        elif key in SUBSCHEMA_MAPS:
            out[key] = {name: convert(item) for name, item in value.items()}
        else:
            out[key] = value
    return allow_null(out) if schema.get("nullable") is True else out


def allow_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` widened to accept ``null`` too (what ``nullable: true`` meant in OpenAPI 3.0)."""
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        schema = {**schema, "type": types if "null" in types else [*types, "null"]}
        if "enum" in schema and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
        return schema
    # No ``type`` to widen: keep the annotations (``default``) outside, the assertions inside.
    annotations = {key: schema[key] for key in ("default",) if key in schema}
    inner = {key: value for key, value in schema.items() if key not in annotations}
    return {**annotations, "anyOf": [inner, {"type": "null"}]}


def references(schema: Any) -> set[str]:
    """The component names that ``schema`` (OpenAPI form) refers to, at any depth."""
    found: set[str] = set()
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(OPENAPI_REF_PREFIX):
            found.add(ref.removeprefix(OPENAPI_REF_PREFIX))
        for value in schema.values():
            found |= references(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= references(item)
    return found


def vendor(spec: dict[str, Any], roots: tuple[str, ...] = ROOTS) -> dict[str, Any]:
    """The JSON Schema document: ``{"$schema", "$comment", "$defs": {name: schema}}``.

    Raises ``KeyError`` if a root or a referenced schema is missing from the spec.
    """
    components = spec["components"]["schemas"]
    pending, names = list(roots), set()
    while pending:
        name = pending.pop()
        if name not in names:
            names.add(name)
            pending.extend(references(components[name]))
    version = spec.get("info", {}).get("version", "unknown")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": (f"Generated by tools/vendor_openai_schema.py from OpenAI's OpenAPI spec {version}; do not edit."),
        "$defs": {name: convert(components[name]) for name in sorted(names)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", type=Path, default=DEFAULT_SPEC, help="openai-openapi.yaml")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    with args.spec.open(encoding="utf-8") as handle:
        # The C loader when PyYAML has it: the spec is ~3 MB and the pure-Python loader is slow.
        spec = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    document = vendor(spec)
    args.output.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(document['$defs'])} schemas to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
