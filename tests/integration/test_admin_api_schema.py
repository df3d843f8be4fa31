"""``/v1/organization/openapi.json``: the Administration API's schema, generated from the code, against OpenAI's.

The shapes (property names, JSON types, ``enum``s, required properties) of what we answer (the
audit log's entries and the usage pages included) are
compared with the shared spec's (``../shared/openai-openapi.yaml``) component by component (an
``enum`` here may hold fewer values: owners are never service accounts); our
extensions and the spec's properties we leave out are listed here, so that either changing is a
decision.  Skipped where the spec is not beside the checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from audit.models import EVENT_TYPES
from audit.receivers import KEY_FIELDS
from tests.admin_api import get

SPEC = Path(__file__).resolve().parents[3] / "shared" / "openai-openapi.yaml"
BASE = "/v1/organization"

# (ours: a component, or (path, method) for a 200 response; the spec's component)
PAIRS = [
    ("AdminApiKey", "AdminApiKey"),
    ("AdminApiKeyCreateResponse", "AdminApiKeyCreateResponse"),
    ("User", "User"),
    ("UserDeleteResponse", "UserDeleteResponse"),
    ("ProjectApiKey", "ProjectApiKey"),
    ("ProjectApiKeyDeleteResponse", "ProjectApiKeyDeleteResponse"),
    ("ProjectRateLimit", "ProjectRateLimit"),
    ("ProjectRateLimitUpdateRequest", "ProjectRateLimitUpdateRequest"),
    ((f"{BASE}/admin_api_keys", "get"), "ApiKeyList"),
    ((f"{BASE}/users", "get"), "UserListResponse"),
    ((f"{BASE}/projects/{{project_id}}/api_keys", "get"), "ProjectApiKeyListResponse"),
    ((f"{BASE}/projects/{{project_id}}/rate_limits", "get"), "ProjectRateLimitListResponse"),
    ("AuditLog", "AuditLog"),
    ((f"{BASE}/audit_logs", "get"), "ListAuditLogsResponse"),
    ("UsageCompletionsResult", "UsageCompletionsResult"),
    ("UsageTimeBucket", "UsageTimeBucket"),
    ((f"{BASE}/usage/completions", "get"), "UsageResponse"),
]
# An audited key's fields besides the spec's are audit.receivers.KEY_FIELDS: limits, name, expiry, models.
_USER_FIELDS = ("username", "email")
# Our extensions (after OpenAI's fields), by dotted path inside each shape.
EXTENSIONS = {
    "AdminApiKey": {"scope"},
    "AdminApiKeyCreateResponse": {"scope"},
    "User": {"username"},
    "ProjectApiKey": {
        "expires_at", "models", "max_requests_per_1_minute", "max_tokens_per_1_minute", "max_concurrent_requests",
        "max_tokens_per_1_month", "max_budget", "budget_period",
    },
    "ProjectRateLimit": {
        "api_key_id", "max_concurrent_requests", "max_tokens_per_1_month", "max_budget", "budget_period",
    },
    "ProjectRateLimitUpdateRequest": {"max_concurrent_requests", "max_tokens_per_1_month", "max_budget", "budget_period"},
    "AuditLog": {
        "actor.system",
        "api_key.created.data.user_id", *(f"api_key.created.data.{name}" for name in KEY_FIELDS),
        *(f"api_key.updated.changes_requested.{name}" for name in KEY_FIELDS),
        *(f"user.added.data.{name}" for name in _USER_FIELDS),
        *(f"user.updated.changes_requested.{name}" for name in
          (*_USER_FIELDS, "first_name", "last_name", "is_active", "is_superuser", "password")),
        "login.failed.username",
    },
    "UsageCompletionsResult": {"endpoint"},
}  # fmt: skip
# Values of an enum beyond the spec's: the command line acts as a "system" actor.
EXTRA_VALUES = {"AuditLog": {"actor.type": {"system"}}}
# The spec's properties that do not exist here: no service accounts, no default user, no image or
# audio models, no daily or batch limits (the update request answers those with unsupported_parameter).
OMITTED = {
    "User": {
        "is_default", "created", "user", "is_service_account", "is_scale_tier_authorized_purchaser", "is_scim_managed",
        "api_key_last_used_at", "technical_level", "developer_persona", "projects",
    },
    "ProjectApiKey": {"owner.service_account"},
    "ProjectRateLimit": {
        "max_images_per_1_minute", "max_audio_megabytes_per_1_minute", "max_requests_per_1_day",
        "batch_1_day_max_input_tokens",
    },
    "ProjectRateLimitUpdateRequest": {
        "max_images_per_1_minute", "max_audio_megabytes_per_1_minute", "max_requests_per_1_day",
        "batch_1_day_max_input_tokens",
    },
    # No projects, no service accounts, no scopes; and only the event types of EVENT_TYPES (see
    # test_the_audit_log_leaves_out_only_event_types_it_does_not_record).
    "AuditLog": {"project", "actor.api_key.service_account", "api_key.updated.changes_requested.scopes"},
    # No cache writes, no text/audio/image split, no service tiers (the fields we have are totals).
    "UsageCompletionsResult": {
        "input_cache_write_tokens", "input_uncached_tokens", "input_text_tokens", "output_text_tokens",
        "input_cached_text_tokens", "input_cached_audio_tokens", "input_image_tokens", "input_cached_image_tokens",
        "output_image_tokens", "service_tier",
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    if not SPEC.exists():
        pytest.skip("OpenAI's spec is not beside the checkout (../shared)")
    import yaml

    with SPEC.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture
def ours(db) -> dict[str, Any]:
    answer = get("/openapi.json", None)
    assert answer.status == 200
    return answer.body


def resolve(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with ``$ref``s followed and ``allOf`` merged (properties and required lists joined)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return resolve(document["components"]["schemas"][name], document)
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in schema["allOf"]:
            part = resolve(part, document)
            for key, value in part.items():
                if key == "properties":
                    merged["properties"].update(value)
                elif key == "required":
                    merged["required"] += value
                else:
                    merged.setdefault(key, value)
        return {**{k: v for k, v in schema.items() if k != "allOf"}, **merged}
    return schema


def json_types(schema: dict[str, Any], document: dict[str, Any]) -> set[str]:
    """The JSON types ``schema`` takes, ``null`` left out (OpenAPI 3.0's ``nullable`` or 3.1's ``anyOf``)."""
    schema = resolve(schema, document)
    if "anyOf" in schema or "oneOf" in schema:
        return set().union(*(json_types(s, document) for s in schema.get("anyOf", schema.get("oneOf", []))))
    kind = schema.get("type")
    if kind is None:
        return {"object"} if "properties" in schema else set()
    return {kind} - {"null"} if isinstance(kind, str) else set(kind) - {"null"}


def non_null(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    schema = resolve(schema, document)
    for branch in schema.get("anyOf", []):
        if branch.get("type") != "null":
            return resolve(branch, document)
    return schema


def differences(
    mine: dict, theirs: dict, ours: dict, spec: dict, where: str, skip: set[str], extra: dict | None = None
) -> list[str]:
    """What differs between two object schemas, as readable lines (empty when they agree).

    ``extra``: ``{path: values}`` an enum here may hold beyond the spec's."""
    extra = extra or {}
    mine, theirs = non_null(mine, ours), non_null(theirs, spec)
    found = []
    mine_props, their_props = mine.get("properties", {}), theirs.get("properties", {})
    for name in set(mine_props) | set(their_props):
        path = f"{where}{name}"
        if path in skip:
            continue
        if name not in mine_props:
            found.append(f"{path}: missing here")
            continue
        if name not in their_props:
            found.append(f"{path}: not in the spec")
            continue
        a, b = non_null(mine_props[name], ours), non_null(their_props[name], spec)
        if json_types(a, ours) != json_types(b, spec):
            found.append(f"{path}: {sorted(json_types(a, ours))} here, {sorted(json_types(b, spec))} in the spec")
        if "enum" in b and not set(a.get("enum", [None])) - extra.get(path, set()) <= set(
            b["enum"]
        ):  # ours may be fewer
            found.append(f"{path}: enum {a.get('enum')} here, {b['enum']} in the spec")
        if json_types(b, spec) == {"object"} and "properties" in b:
            found += differences(a, b, ours, spec, f"{path}.", skip, extra)
        if json_types(b, spec) == {"array"}:
            items_a, items_b = non_null(a.get("items", {}), ours), non_null(b.get("items", {}), spec)
            if json_types(items_a, ours) != json_types(items_b, spec):
                found.append(f"{path}[]: item types differ")
            elif "properties" in items_b:
                found += differences(items_a, items_b, ours, spec, f"{path}[].", skip, extra)
    for name in theirs.get("required", []):
        if f"{where}{name}" not in skip and name not in mine.get("required", []):
            found.append(f"{where}{name}: required in the spec, optional here")
    return found


def our_schema(ours: dict, key: Any) -> dict:
    if isinstance(key, str):
        return ours["components"]["schemas"][key]
    path, method = key
    return ours["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]


@pytest.mark.parametrize(("mine", "theirs"), PAIRS, ids=[theirs for _, theirs in PAIRS])
def test_our_shape_matches_the_specs(spec, ours, mine, theirs):
    skip = EXTENSIONS.get(theirs, set()) | OMITTED.get(theirs, set()) | unrecorded_event_types(spec, theirs)
    extra = dict(EXTRA_VALUES.get(theirs, {}))
    # Lists hold the items compared above: their extensions and omissions are the items'.
    item_skips = {"ApiKeyList": "AdminApiKey", "UserListResponse": "User",
                  "ProjectApiKeyListResponse": "ProjectApiKey", "ProjectRateLimitListResponse": "ProjectRateLimit",
                  "ListAuditLogsResponse": "AuditLog"}  # fmt: skip
    if theirs in item_skips:
        item = item_skips[theirs]
        hidden = EXTENSIONS.get(item, set()) | OMITTED.get(item, set()) | unrecorded_event_types(spec, item)
        skip |= {f"data[].{name}" for name in hidden}
        extra |= {f"data[].{path}": values for path, values in EXTRA_VALUES.get(item, {}).items()}

    found = differences(our_schema(ours, mine), spec["components"]["schemas"][theirs], ours, spec, "", skip, extra)

    assert found == []


def unrecorded_event_types(spec: dict, component: str) -> set[str]:
    """The ``AuditLog`` payloads of event types we never record (every type but ``EVENT_TYPES``)."""
    if component != "AuditLog":
        return set()
    return set(spec["components"]["schemas"]["AuditLog"]["properties"]) & (
        set(spec["components"]["schemas"]["AuditLogEventType"]["enum"]) - set(EVENT_TYPES)
    )


def test_the_audit_log_leaves_out_only_event_types_it_does_not_record(spec, ours):
    theirs = spec["components"]["schemas"]["AuditLog"]["properties"]
    mine = ours["components"]["schemas"]["AuditLog"]["properties"]

    assert set(EVENT_TYPES) <= set(spec["components"]["schemas"]["AuditLogEventType"]["enum"])
    assert set(theirs) - set(mine) == unrecorded_event_types(spec, "AuditLog") | {"project"}
    assert set(mine["type"]["enum"]) == set(EVENT_TYPES)


def test_our_extensions_and_omissions_are_what_this_file_lists(spec, ours):
    for _mine, theirs in PAIRS:
        for name in EXTENSIONS.get(theirs, set()):
            assert name not in spec["components"]["schemas"][theirs].get("properties", {}), (theirs, name)


def test_the_schema_is_served_without_a_key_and_covers_every_route(ours):
    assert set(ours["paths"]) == {
        f"{BASE}/admin_api_keys",
        f"{BASE}/admin_api_keys/{{key_id}}",
        f"{BASE}/users",
        f"{BASE}/users/{{user_id}}",
        f"{BASE}/projects/{{project_id}}/api_keys",
        f"{BASE}/projects/{{project_id}}/api_keys/{{api_key_id}}",
        f"{BASE}/projects/{{project_id}}/rate_limits",
        f"{BASE}/projects/{{project_id}}/rate_limits/{{rate_limit_id}}",
        f"{BASE}/audit_logs",
        f"{BASE}/usage/completions",
        f"{BASE}/users/{{user_id}}/limits",
        f"{BASE}/model_prices",
        f"{BASE}/model_prices/{{model}}",
        f"{BASE}/costs",
    }
    assert ours["components"]["securitySchemes"] == {
        "AdminApiKeyAuth": {"type": "http", "scheme": "bearer", "description": "An admin key, sk-cs-admin-..."}
    }
