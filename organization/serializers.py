"""The Administration API's shapes: OpenAI's objects (responses) and requests, as DRF serializers.

Responses follow the spec (``openai-openapi.yaml``) field for field, in its order; drf-spectacular
names each component after its serializer (``AdminApiKeySerializer`` → ``AdminApiKey``), and
``tests/integration/test_admin_api_schema.py`` compares them with the spec's.  Our extensions sit
after OpenAI's fields.  Ids (``keys.ids``, shared with the usage API and the audit log): ``user_{pk}``
for users, ``key_{prefix}`` for API keys and admin keys, ``rl_{prefix}`` for a key's rate limit.

Requests are strict: a field of the wrong JSON type is an ``invalid_type`` (``"12"`` is no integer,
``12`` no string), an unknown field is OpenAI's "Unrecognized request argument supplied", a field
of the spec that this server does not do is ``unsupported_parameter`` (:class:`RequestSerializer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.errors import APIError, unrecognized_arguments_error
from audit.models import EVENT_TYPES, AuditLogEntry
from keys import ids
from keys.limits import Limits
from keys.models import BUDGET_PERIODS, KEY_NAMESPACE, APIKey, UserLimits, parse_model_list
from keys.pricing import to_money

from .models import Scope

User = get_user_model()

# The largest values the key's columns hold (PositiveIntegerField, PositiveBigIntegerField).
MAX_INT = 2_147_483_647
MAX_BIGINT = 9_223_372_036_854_775_807
PERIOD_NAMES = [name for name, _ in BUDGET_PERIODS]


def budget_field(**kwargs: Any) -> serializers.DecimalField:
    """A money budget in a request: a number of the prices' currency, ``null`` the default, ``0`` none."""
    return serializers.DecimalField(
        max_digits=14, decimal_places=4, min_value=0, allow_null=True, required=False, **kwargs
    )


def price_field(**kwargs: Any) -> serializers.DecimalField:
    """A price per million tokens (a JSON number in answers)."""
    return serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0, coerce_to_string=False, **kwargs)


# --- Fields ---------------------------------------------------------------------------------------


class UnixTimeField(serializers.IntegerField):
    """A ``datetime`` as Unix seconds (OpenAI's ``format: unixtime``); ``null`` stays ``null``."""

    def to_representation(self, value: datetime) -> int:
        return int(value.timestamp())


class ConstField(serializers.ChoiceField):
    """The ``object`` field of OpenAI's shapes: one constant string (an ``enum`` of one in the schema)."""

    def __init__(self, value: str, **kwargs: Any) -> None:
        self.value = value
        super().__init__(choices=[value], source="*", read_only=True, **kwargs)

    def to_representation(self, value: Any) -> str:
        return self.value


class StrictIntegerField(serializers.IntegerField):
    """An integer that must be a JSON integer: not ``"12"``, ``12.0`` or ``true`` (DRF takes those)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A string that must be a JSON string: not ``12`` (DRF's ``CharField`` turns it into ``"12"``)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictChoiceField(serializers.ChoiceField):
    """A choice among strings that must be a JSON string."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            raise serializers.ValidationError("Not a string.", code="invalid")
        return super().to_internal_value(data)


def user_id(user: Any) -> str:
    """A user's public id: ``user_{pk}`` (``keys.ids``)."""
    return ids.user_id(user.pk)


def user_role(user: Any) -> str:
    """OpenAI's organization role: ``owner`` for staff (the admin's users), else ``reader``."""
    return "owner" if user.is_staff else "reader"


def user_name(user: Any) -> str:
    """The user's full name, or the username when there is none."""
    return user.get_full_name() or user.username


def api_key_id(api_key: APIKey) -> str:
    """An API key's public id: ``key_{prefix}`` (``keys.ids``; the usage API's ``api_key_id``)."""
    return ids.api_key_id(api_key.prefix)


# --- Requests -------------------------------------------------------------------------------------


class RequestSerializer(serializers.Serializer):
    """A request body: a JSON object whose every field is known.

    ``unsupported`` names fields of the spec's request that this server does not do: each is a 400
    ``unsupported_parameter`` naming it.  Any other unknown field is OpenAI's "Unrecognized request
    argument supplied".
    """

    unsupported: tuple[str, ...] = ()

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            for name in self.unsupported:
                if name in data:
                    raise APIError(
                        f"Unsupported parameter: '{name}' is not supported by this server.",
                        param=name,
                        code="unsupported_parameter",
                    )
            unknown = [name for name in data if name not in self.fields or self.fields[name].read_only]
            if unknown:
                raise unrecognized_arguments_error(unknown)
        return super().to_internal_value(data)


class AdminApiKeyCreateRequestSerializer(RequestSerializer):
    """``POST /v1/organization/admin_api_keys``: ``name``, an optional ``expires_in_seconds`` and
    ``scope`` (our extension; ``owner`` unless asked)."""

    name = StrictCharField(max_length=100)
    expires_in_seconds = StrictIntegerField(required=False, min_value=1, max_value=31_536_000)
    scope = StrictChoiceField(choices=Scope.values, required=False, default=Scope.OWNER)


class UserCreateRequestSerializer(RequestSerializer):
    """``POST /v1/organization/users`` (our extension; OpenAI invites by e-mail instead).

    ``role`` defaults to ``reader``; without ``password`` the user cannot log in to the account
    pages (staff may set one in the admin later), but keys issued to them work.
    """

    username = StrictCharField(max_length=150)
    email = serializers.EmailField(required=False, allow_blank=True, max_length=254)
    name = StrictCharField(required=False, allow_blank=True, max_length=150)
    role = StrictChoiceField(choices=["owner", "reader"], required=False, default="reader")
    password = StrictCharField(required=False, write_only=True, max_length=128)

    def validate_username(self, value: str) -> str:
        username_field = User._meta.get_field("username")
        try:
            username_field.run_validators(value)
        except DjangoValidationError as error:
            raise serializers.ValidationError(" ".join(error.messages), code="invalid_value") from None
        if User.objects.filter(username=value).exists():
            raise serializers.ValidationError("A user with that username already exists.", code="unique")
        return value

    def validate_password(self, value: str) -> str:
        try:
            validate_password(value, User(username=self.initial_data.get("username", "")))
        except DjangoValidationError as error:
            raise serializers.ValidationError(" ".join(error.messages), code="invalid_value") from None
        return value


class UserRoleUpdateRequestSerializer(RequestSerializer):
    """``POST /v1/organization/users/{user_id}``: the spec's ``UserRoleUpdateRequest``, ``role`` only."""

    unsupported = ("role_id", "technical_level", "developer_persona")

    role = StrictChoiceField(choices=["owner", "reader"])


class KeyLimitsRequestSerializer(RequestSerializer):
    """The per-key fields the admin edits, as an API key's create and update requests take them.

    A limit is ``null`` for the site's default (``API_DEFAULT_*``), ``0`` for no limit; ``models``
    are the model ids the key may use (``[]``: every model); ``expires_at`` is Unix seconds
    (``null``: never).
    """

    name = StrictCharField(max_length=100)
    models = serializers.ListField(child=StrictCharField(max_length=200), required=False, max_length=50)
    max_requests_per_1_minute = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_INT)
    max_tokens_per_1_minute = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_BIGINT)
    max_concurrent_requests = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_INT)
    max_tokens_per_1_month = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_BIGINT)
    max_budget = budget_field()
    budget_period = StrictChoiceField(choices=PERIOD_NAMES, required=False, allow_null=True)
    expires_at = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=253_402_300_799)
    expires_in_seconds = StrictIntegerField(required=False, min_value=1, max_value=100 * 365 * 86400)

    unsupported = ("scopes",)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "expires_at" in attrs and "expires_in_seconds" in attrs:
            raise APIError(
                "Give 'expires_at' or 'expires_in_seconds', not both.", param="expires_in_seconds", code="invalid_value"
            )
        return attrs

    def validate_models(self, value: list[str]) -> list[str]:
        for index, model in enumerate(value):
            if not model.strip() or "," in model or any(char.isspace() for char in model):
                raise serializers.ValidationError({index: [f"'{model}' is not a model id."]}, code="invalid_value")
        if len(",".join(value)) > cast(int, APIKey._meta.get_field("allowed_models").max_length):
            raise serializers.ValidationError("Too many model ids for one key.", code="invalid_value")
        return value


class ProjectApiKeyCreateRequestSerializer(KeyLimitsRequestSerializer):
    """``POST /v1/organization/projects/{user_id}/api_keys`` (our extension): a new key for the user."""


class ProjectApiKeyUpdateRequestSerializer(KeyLimitsRequestSerializer):
    """``POST /v1/organization/projects/{user_id}/api_keys/{key_id}`` (our extension): any of the fields."""

    name = StrictCharField(max_length=100, required=False)


class PerMinuteLimitsRequestSerializer(RequestSerializer):
    """Requests and tokens per minute, the fields a key's limits over all models and its limits for
    one model share (``null``: the default, or none of its own)."""

    max_requests_per_1_minute = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_INT)
    max_tokens_per_1_minute = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_BIGINT)


class ProjectRateLimitUpdateRequestSerializer(PerMinuteLimitsRequestSerializer):
    """``POST .../rate_limits/{rate_limit_id}``: the spec's ``ProjectRateLimitUpdateRequest`` where it maps.

    ``null`` returns a limit to the site's default, ``0`` lifts it.  The image, audio, daily and batch
    limits are ``unsupported_parameter``; the concurrency and monthly-token limits are our extensions.
    """

    unsupported = (
        "max_images_per_1_minute",
        "max_audio_megabytes_per_1_minute",
        "max_requests_per_1_day",
        "batch_1_day_max_input_tokens",
    )

    max_concurrent_requests = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_INT)
    max_tokens_per_1_month = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_BIGINT)
    max_budget = budget_field()
    budget_period = StrictChoiceField(choices=PERIOD_NAMES, required=False, allow_null=True)


class ModelRateLimitUpdateRequestSerializer(PerMinuteLimitsRequestSerializer):
    """``POST .../rate_limits/rl_{prefix}:{model}``: the key's own requests and tokens per minute for
    one model (``null``: none of its own; ``0`` too).  The key's other limits are not per model:
    ``unsupported_parameter`` here, set them on ``rl_{prefix}``."""

    unsupported = (
        *ProjectRateLimitUpdateRequestSerializer.unsupported,
        "max_concurrent_requests",
        "max_tokens_per_1_month",
        "max_budget",
        "budget_period",
    )


class UserLimitsUpdateRequestSerializer(RequestSerializer):
    """``POST /v1/organization/users/{user_id}/limits`` (our extension): the user's own limits across
    all of their keys; ``null`` returns one to the site's default (``API_USER_DEFAULT_*``,
    ``API_USER_MAX_KEYS``), ``0`` lifts it."""

    max_requests_per_1_minute = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_INT)
    max_tokens_per_1_minute = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_BIGINT)
    max_concurrent_requests = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_INT)
    max_tokens_per_1_month = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_BIGINT)
    max_budget = budget_field()
    budget_period = StrictChoiceField(choices=PERIOD_NAMES, required=False, allow_null=True)
    max_api_keys = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_INT)


class ModelPriceRequestSerializer(RequestSerializer):
    """``POST /v1/organization/model_prices`` (our extension): set one model's prices, per million tokens."""

    model = StrictCharField(max_length=200)
    prompt_per_million = price_field()
    completion_per_million = price_field()


# The request fields of the limits, and the APIKey (and UserLimits) columns they set; a
# ``budget_period`` of ``null`` is stored as "" (the default).
LIMIT_COLUMNS = {
    "max_requests_per_1_minute": "rpm_limit",
    "max_tokens_per_1_minute": "tpm_limit",
    "max_concurrent_requests": "max_concurrent",
    "max_tokens_per_1_month": "monthly_token_quota",
    "max_budget": "budget",
    "budget_period": "budget_period",
}
USER_LIMIT_COLUMNS = {**LIMIT_COLUMNS, "max_api_keys": "max_keys"}


def limit_columns(fields: dict[str, Any], columns: dict[str, str] = LIMIT_COLUMNS) -> dict[str, Any]:
    """The limit fields present in ``fields`` as model columns."""
    values = {columns[name]: value for name, value in fields.items() if name in columns}
    if "budget_period" in values and values["budget_period"] is None:
        values["budget_period"] = ""
    return values


# --- Responses ------------------------------------------------------------------------------------


class UserIdentity:
    """``id``, ``name`` and ``role`` of a user, for the serializers that declare those method fields."""

    @extend_schema_field(OpenApiTypes.STR)
    def get_id(self, user: Any) -> str:
        return user_id(user)

    @extend_schema_field(OpenApiTypes.STR)
    def get_name(self, user: Any) -> str:
        return user_name(user)

    @extend_schema_field(OpenApiTypes.STR)
    def get_role(self, user: Any) -> str:
        return user_role(user)


class UserSerializer(UserIdentity, serializers.Serializer):
    """The spec's ``User`` (``organization.user``), plus our ``username``."""

    object = ConstField("organization.user")
    id = serializers.SerializerMethodField()
    name = serializers.SerializerMethodField()
    email = serializers.CharField(allow_null=True, read_only=True)
    role = serializers.SerializerMethodField()
    added_at = UnixTimeField(source="date_joined", read_only=True)
    username = serializers.CharField(read_only=True)


class UserDeleteResponseSerializer(serializers.Serializer):
    """The spec's ``UserDeleteResponse``."""

    object = ConstField("organization.user.deleted")
    id = serializers.CharField()
    deleted = serializers.BooleanField()


class AdminApiKeyOwnerSerializer(UserIdentity, serializers.Serializer):
    """``AdminApiKey.owner``: the staff user the key acts for."""

    type = ConstField("user")
    object = ConstField("organization.user")
    id = serializers.SerializerMethodField()
    name = serializers.SerializerMethodField()
    created_at = UnixTimeField(source="date_joined", read_only=True)
    role = serializers.SerializerMethodField()


class AdminApiKeySerializer(serializers.Serializer):
    """The spec's ``AdminApiKey`` (``organization.admin_api_key``)."""

    object = ConstField("organization.admin_api_key")
    id = serializers.CharField(source="public_id", read_only=True)
    name = serializers.CharField(allow_null=True, read_only=True)
    redacted_value = serializers.CharField(read_only=True)
    created_at = UnixTimeField(read_only=True)
    expires_at = UnixTimeField(allow_null=True, read_only=True)
    last_used_at = UnixTimeField(allow_null=True, read_only=True)
    owner = AdminApiKeyOwnerSerializer(read_only=True)
    scope = serializers.ChoiceField(choices=Scope.values, read_only=True)  # ours: owner or read_only


class AdminApiKeyCreateResponseSerializer(AdminApiKeySerializer):
    """The spec's ``AdminApiKeyCreateResponse``: the key and, this once, its ``value``."""

    value = serializers.CharField(read_only=True)


class AdminApiKeyDeleteResponseSerializer(serializers.Serializer):
    """The admin key ``DELETE``'s answer (``organization.admin_api_key.deleted``)."""

    id = serializers.CharField()
    object = ConstField("organization.admin_api_key.deleted")
    deleted = serializers.BooleanField()


class ProjectApiKeyOwnerUserSerializer(UserIdentity, serializers.Serializer):
    """The spec's ``ProjectApiKeyOwnerUser``: the key's owner."""

    id = serializers.SerializerMethodField()
    email = serializers.CharField(read_only=True)
    name = serializers.SerializerMethodField()
    created_at = UnixTimeField(source="date_joined", read_only=True)
    role = serializers.SerializerMethodField()


class ProjectApiKeyOwnerSerializer(serializers.Serializer):
    """``ProjectApiKey.owner``: always a user here (there are no service accounts)."""

    type = ConstField("user")
    user = ProjectApiKeyOwnerUserSerializer(source="owner", read_only=True)


class ProjectApiKeySerializer(serializers.Serializer):
    """The spec's ``ProjectApiKey`` (``organization.project.api_key``), then the key's own settings.

    Extensions: ``expires_at``, ``models`` (``[]``: every model) and the key's own limits, ``null``
    where the key uses the site's default (the effective values are its rate limit's).
    """

    object = ConstField("organization.project.api_key")
    redacted_value = serializers.SerializerMethodField()
    name = serializers.CharField(read_only=True)
    created_at = UnixTimeField(read_only=True)
    last_used_at = UnixTimeField(allow_null=True, read_only=True)
    id = serializers.SerializerMethodField()
    owner_project_access = serializers.SerializerMethodField()
    owner = ProjectApiKeyOwnerSerializer(source="*", read_only=True)
    expires_at = UnixTimeField(allow_null=True, read_only=True)
    models = serializers.ListField(child=serializers.CharField(), read_only=True)
    max_requests_per_1_minute = serializers.IntegerField(source="rpm_limit", allow_null=True, read_only=True)
    max_tokens_per_1_minute = serializers.IntegerField(source="tpm_limit", allow_null=True, read_only=True)
    max_concurrent_requests = serializers.IntegerField(source="max_concurrent", allow_null=True, read_only=True)
    max_tokens_per_1_month = serializers.IntegerField(source="monthly_token_quota", allow_null=True, read_only=True)
    max_budget = serializers.DecimalField(
        source="budget", max_digits=14, decimal_places=4, coerce_to_string=False, allow_null=True, read_only=True
    )
    budget_period = serializers.SerializerMethodField()

    @extend_schema_field({"type": "string", "enum": PERIOD_NAMES, "nullable": True})
    def get_budget_period(self, api_key: APIKey) -> str | None:
        return api_key.budget_period or None

    @extend_schema_field(OpenApiTypes.STR)
    def get_redacted_value(self, api_key: APIKey) -> str:
        return f"{KEY_NAMESPACE}{api_key.prefix}..."

    @extend_schema_field(OpenApiTypes.STR)
    def get_id(self, api_key: APIKey) -> str:
        return api_key_id(api_key)

    @extend_schema_field({"type": "string", "enum": ["active", "inactive"]})
    def get_owner_project_access(self, api_key: APIKey) -> str:
        return "active" if api_key.owner.is_active else "inactive"


class ProjectApiKeyCreateResponseSerializer(ProjectApiKeySerializer):
    """A new API key (our extension) and, this once, its ``value``."""

    value = serializers.CharField(read_only=True)


class ProjectApiKeyDeleteResponseSerializer(serializers.Serializer):
    """The spec's ``ProjectApiKeyDeleteResponse``."""

    object = ConstField("organization.project.api_key.deleted")
    id = serializers.CharField()
    deleted = serializers.BooleanField()


@dataclass(frozen=True)
class RateLimit:
    """One ``ProjectRateLimit``: an API key's limits over all of its models (``model`` ``""``), or
    its own requests and tokens per minute for one ``model`` (``APIKey.model_limits``)."""

    api_key: APIKey
    model: str = ""

    @classmethod
    def all_of(cls, api_key: APIKey) -> list[RateLimit]:
        """The key's rate limits: over all models, then its own for each model, by model id."""
        return [cls(api_key), *(cls(api_key, model) for model, _, _ in api_key.own_model_limits())]


class ProjectRateLimitSerializer(serializers.Serializer):
    """The spec's ``ProjectRateLimit`` (``project.rate_limit``) of a :class:`RateLimit`: the limits in force.

    For a key's limits over all models (``rl_{prefix}``), ``model`` is the key's models comma-separated,
    ``*`` for every model, and the values are effective: the key's own or else the site's default
    (``keys.limits.Limits.of``).  For its own limits for one model (``rl_{prefix}:{model}``), ``model``
    is that model and only the per-minute limits are there (a key's other limits are not per model).
    ``0`` means no limit.  Extensions: ``api_key_id``, ``max_concurrent_requests``,
    ``max_tokens_per_1_month``, ``max_budget``, ``budget_period``.
    """

    object = ConstField("project.rate_limit")
    id = serializers.SerializerMethodField()
    model = serializers.SerializerMethodField()
    max_requests_per_1_minute = serializers.SerializerMethodField()
    max_tokens_per_1_minute = serializers.SerializerMethodField()
    api_key_id = serializers.SerializerMethodField()
    max_concurrent_requests = serializers.SerializerMethodField(required=False)
    max_tokens_per_1_month = serializers.SerializerMethodField(required=False)
    max_budget = serializers.SerializerMethodField(required=False)
    budget_period = serializers.SerializerMethodField(required=False)

    KEY_WIDE = ("max_concurrent_requests", "max_tokens_per_1_month", "max_budget", "budget_period")

    def to_representation(self, instance: RateLimit) -> dict[str, Any]:
        shown = super().to_representation(instance)
        if instance.model:
            for name in self.KEY_WIDE:
                shown.pop(name, None)
        return shown

    @extend_schema_field(OpenApiTypes.NUMBER)
    def get_max_budget(self, limit: RateLimit) -> float:
        return float(to_money(Limits.of(limit.api_key).budget))

    @extend_schema_field({"type": "string", "enum": PERIOD_NAMES})
    def get_budget_period(self, limit: RateLimit) -> str:
        return Limits.of(limit.api_key).budget_period

    @extend_schema_field(OpenApiTypes.STR)
    def get_id(self, limit: RateLimit) -> str:
        return ids.rate_limit_id(limit.api_key.prefix, limit.model)

    @extend_schema_field(OpenApiTypes.STR)
    def get_model(self, limit: RateLimit) -> str:
        return limit.model or ",".join(parse_model_list(limit.api_key.allowed_models)) or "*"

    @extend_schema_field(OpenApiTypes.INT)
    def get_max_requests_per_1_minute(self, limit: RateLimit) -> int:
        return self._per_minute(limit)[0]

    @extend_schema_field(OpenApiTypes.INT)
    def get_max_tokens_per_1_minute(self, limit: RateLimit) -> int:
        return self._per_minute(limit)[1]

    @staticmethod
    def _per_minute(limit: RateLimit) -> tuple[int, int]:
        if limit.model:
            return limit.api_key.limits_for_model(limit.model) or (0, 0)
        in_force = Limits.of(limit.api_key)
        return in_force.rpm, in_force.tpm

    @extend_schema_field(OpenApiTypes.STR)
    def get_api_key_id(self, limit: RateLimit) -> str:
        return api_key_id(limit.api_key)

    @extend_schema_field(OpenApiTypes.INT)
    def get_max_concurrent_requests(self, limit: RateLimit) -> int:
        return Limits.of(limit.api_key).max_concurrent

    @extend_schema_field(OpenApiTypes.INT)
    def get_max_tokens_per_1_month(self, limit: RateLimit) -> int:
        return Limits.of(limit.api_key).monthly_tokens


# --- The audit log and the organization's usage ---------------------------------------------------
# Their answers are built elsewhere (``audit.models.AuditLogEntry.to_dict``, ``api.usage_api``); these
# serializers say their shape, for the generated schema (and the schema test's comparison with the spec).


class AuditLogActorUserSerializer(serializers.Serializer):
    """The spec's ``AuditLogActorUser``: the person behind a session or an admin key."""

    id = serializers.CharField()
    email = serializers.CharField(required=False)


class AuditLogActorSessionSerializer(serializers.Serializer):
    """The spec's ``AuditLogActorSession``: no ``user`` when nobody was signed in (a sign-up, a failed login)."""

    user = AuditLogActorUserSerializer(required=False)
    ip_address = serializers.CharField(required=False)


class AuditLogActorApiKeySerializer(serializers.Serializer):
    """The spec's ``AuditLogActorApiKey``: an admin key (``key_...``) and its owner."""

    id = serializers.CharField()
    type = serializers.ChoiceField(choices=["user"])
    user = AuditLogActorUserSerializer(required=False)


class AuditLogActorSystemSerializer(serializers.Serializer):
    """Our extension: the command line (``manage.py <command>``) or other code with no request."""

    id = serializers.CharField()


class AuditLogActorSerializer(serializers.Serializer):
    """The spec's ``AuditLogActor``, with our ``system`` type besides ``session`` and ``api_key``."""

    type = serializers.ChoiceField(choices=["session", "api_key", "system"])
    session = AuditLogActorSessionSerializer(required=False)
    api_key = AuditLogActorApiKeySerializer(required=False)
    system = AuditLogActorSystemSerializer(required=False)


def _optional(**fields: serializers.Field) -> dict[str, serializers.Field]:
    for field in fields.values():
        field.required = False
    return fields


def _key_fields() -> dict[str, serializers.Field]:
    """A key's audited fields as the audit log shows them (``audit.receivers``)."""
    return _optional(
        name=serializers.CharField(),
        expires_at=serializers.IntegerField(allow_null=True),
        rpm_limit=serializers.IntegerField(allow_null=True),
        tpm_limit=serializers.IntegerField(allow_null=True),
        max_concurrent=serializers.IntegerField(allow_null=True),
        monthly_token_quota=serializers.IntegerField(allow_null=True),
        allowed_models=serializers.ListField(child=serializers.CharField()),
        model_limits=serializers.DictField(child=serializers.DictField(child=serializers.IntegerField())),
    )


def _user_fields() -> dict[str, serializers.Field]:
    """A user's audited fields as the audit log shows them (``audit.receivers``)."""
    return _optional(
        role=serializers.ChoiceField(choices=["owner", "reader"]),
        username=serializers.CharField(),
        email=serializers.CharField(),
    )


def _shape(component: str, /, **fields: serializers.Field) -> type[serializers.Serializer]:
    """A serializer class of ``fields`` named ``{component}Serializer`` (its schema component)."""
    return type(f"{component}Serializer", (serializers.Serializer,), fields)


# Each event type's payload, shown under the type's name (``audit.receivers`` writes them).
AUDIT_PAYLOADS: dict[str, type[serializers.Serializer]] = {
    "api_key.created": _shape(
        "AuditLogApiKeyCreated",
        id=serializers.CharField(),
        data=_shape(
            "AuditLogApiKeyCreatedData",
            scopes=serializers.ListField(child=serializers.CharField()),
            user_id=serializers.CharField(),
            **_key_fields(),
        )(),
    ),
    "api_key.updated": _shape(
        "AuditLogApiKeyUpdated",
        id=serializers.CharField(),
        changes_requested=_shape("AuditLogApiKeyChanges", **_key_fields())(),
    ),
    "api_key.deleted": _shape("AuditLogApiKeyDeleted", id=serializers.CharField()),
    "user.added": _shape(
        "AuditLogUserAdded", id=serializers.CharField(), data=_shape("AuditLogUserAddedData", **_user_fields())()
    ),
    "user.updated": _shape(
        "AuditLogUserUpdated",
        id=serializers.CharField(),
        changes_requested=_shape(
            "AuditLogUserChanges",
            **_user_fields(),
            **_optional(
                first_name=serializers.CharField(),
                last_name=serializers.CharField(),
                is_active=serializers.BooleanField(),
                is_superuser=serializers.BooleanField(),
                password=serializers.ChoiceField(choices=["changed"]),
            ),
        )(),
    ),
    "user.deleted": _shape("AuditLogUserDeleted", id=serializers.CharField()),
    "login.failed": _shape(
        "AuditLogLoginFailed",
        error_code=serializers.CharField(),
        error_message=serializers.CharField(),
        username=serializers.CharField(allow_null=True),
    ),
}


class AuditLogSerializer(serializers.Serializer):
    """The spec's ``AuditLog``: ``id``, ``type``, ``effective_at``, ``actor`` and, under the type's name,
    its payload (:data:`AUDIT_PAYLOADS`, e.g. ``api_key.created``)."""

    id = serializers.CharField()
    type = serializers.ChoiceField(choices=list(EVENT_TYPES))
    effective_at = serializers.IntegerField()
    actor = AuditLogActorSerializer()

    def get_fields(self) -> dict[str, serializers.Field]:
        # Dotted names cannot be class attributes; the payloads join here, each optional.
        payloads = {name: shape(required=False) for name, shape in AUDIT_PAYLOADS.items()}
        payloads["login.succeeded"] = serializers.DictField(required=False, help_text="Always empty.")
        return {**super().get_fields(), **payloads}

    def to_representation(self, instance: AuditLogEntry) -> dict[str, Any]:
        return instance.to_dict()


class UsageCompletionsResultSerializer(serializers.Serializer):
    """The spec's ``UsageCompletionsResult`` (``api.usage_api``): the grouping fields not asked for are
    ``null``; our ``endpoint`` only with ``group_by=endpoint``."""

    object = ConstField("organization.usage.completions.result")
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    input_cached_tokens = serializers.IntegerField()
    input_audio_tokens = serializers.IntegerField()
    output_audio_tokens = serializers.IntegerField()
    num_model_requests = serializers.IntegerField()
    project_id = serializers.CharField(allow_null=True)
    user_id = serializers.CharField(allow_null=True)
    api_key_id = serializers.CharField(allow_null=True)
    model = serializers.CharField(allow_null=True)
    batch = serializers.BooleanField(allow_null=True)
    endpoint = serializers.CharField(required=False)


class UsageTimeBucketSerializer(serializers.Serializer):
    """The spec's ``UsageTimeBucket`` of completions results."""

    object = ConstField("bucket")
    start_time = serializers.IntegerField()
    end_time = serializers.IntegerField()
    results = UsageCompletionsResultSerializer(many=True)


class UsageResponseSerializer(serializers.Serializer):
    """The spec's ``UsageResponse``: a page of buckets, ``next_page`` the cursor of the next."""

    object = ConstField("page")
    data = UsageTimeBucketSerializer(many=True)
    has_more = serializers.BooleanField()
    next_page = serializers.CharField(allow_null=True)


# --- Our extensions: a user's limits across their keys, model prices, costs ------------------------


class UserLimitsSerializer(serializers.Serializer):
    """A user's limits across all of their keys (``organization.user.limits``, our extension): the
    user's own values, ``null`` where the site's default applies; ``effective`` the values in force
    (``0``: no limit)."""

    object = ConstField("organization.user.limits")
    user_id = serializers.SerializerMethodField()
    max_requests_per_1_minute = serializers.IntegerField(source="rpm_limit", allow_null=True, read_only=True)
    max_tokens_per_1_minute = serializers.IntegerField(source="tpm_limit", allow_null=True, read_only=True)
    max_concurrent_requests = serializers.IntegerField(source="max_concurrent", allow_null=True, read_only=True)
    max_tokens_per_1_month = serializers.IntegerField(source="monthly_token_quota", allow_null=True, read_only=True)
    max_budget = serializers.DecimalField(
        source="budget", max_digits=14, decimal_places=4, coerce_to_string=False, allow_null=True, read_only=True
    )
    budget_period = serializers.SerializerMethodField()
    max_api_keys = serializers.IntegerField(source="max_keys", allow_null=True, read_only=True)
    effective = serializers.SerializerMethodField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_user_id(self, own: UserLimits) -> str:
        return user_id(own.user)

    @extend_schema_field({"type": "string", "enum": PERIOD_NAMES, "nullable": True})
    def get_budget_period(self, own: UserLimits) -> str | None:
        return own.budget_period or None

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_effective(self, own: UserLimits) -> dict[str, Any]:
        from keys.models import max_keys_of

        limits = Limits.of_user(own)
        return {
            "max_requests_per_1_minute": limits.rpm,
            "max_tokens_per_1_minute": limits.tpm,
            "max_concurrent_requests": limits.max_concurrent,
            "max_tokens_per_1_month": limits.monthly_tokens,
            "max_budget": float(to_money(limits.budget)),
            "budget_period": limits.budget_period,
            "max_api_keys": max_keys_of(own.user_id) if own.pk else settings.API_USER_MAX_KEYS,
        }


class ModelPriceSerializer(serializers.Serializer):
    """A model's prices per million tokens (``organization.model_price``, our extension)."""

    object = ConstField("organization.model_price")
    id = serializers.CharField(source="model", read_only=True)  # a list's cursor: the model id
    model = serializers.CharField(read_only=True)
    prompt_per_million = price_field(read_only=True)
    completion_per_million = price_field(read_only=True)
    updated_at = UnixTimeField(read_only=True)


class ModelPriceDeleteResponseSerializer(serializers.Serializer):
    object = ConstField("organization.model_price.deleted")
    model = serializers.CharField()
    deleted = serializers.BooleanField()


class CostsAmountSerializer(serializers.Serializer):
    """The spec's ``CostsResult.amount``."""

    value = serializers.FloatField()
    currency = serializers.CharField()


class CostsResultSerializer(serializers.Serializer):
    """The spec's ``CostsResult`` (``api.usage_api``): ``line_item`` is the model, ``project_id`` the user."""

    object = ConstField("organization.costs.result")
    amount = CostsAmountSerializer()
    line_item = serializers.CharField(allow_null=True)
    project_id = serializers.CharField(allow_null=True)


class CostsTimeBucketSerializer(serializers.Serializer):
    object = ConstField("bucket")
    start_time = serializers.IntegerField()
    end_time = serializers.IntegerField()
    results = CostsResultSerializer(many=True)


class CostsResponseSerializer(serializers.Serializer):
    object = ConstField("page")
    data = CostsTimeBucketSerializer(many=True)
    has_more = serializers.BooleanField()
    next_page = serializers.CharField(allow_null=True)
