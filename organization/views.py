"""The Administration API's routes: DRF viewsets, thin (shapes in ``serializers``, rules on the models).

Users stand where OpenAI's projects stand: a user's API keys and their rate limits live under
``/v1/organization/projects/{user_id}/...`` (OpenAI's own paths, so its SDK's calls work), and
``/v1/organization/users/...`` are the organization's members (role ``owner`` = staff).  Every
route needs an admin key (``authentication``), answers JSON only, errors in OpenAI's shape
(``exceptions``), lists with OpenAI's cursor pagination (``pagination``).  The audit log
(``audit_logs``) and everyone's usage (``usage/completions``) are routes of this API too; their
protocols are ``audit_query`` and ``api.usage_api`` (shared with the key-scoped usage API).  Ids are
``keys.ids``': ``user_{pk}``, ``key_{prefix}``, ``rl_{prefix}``.

``DELETE`` revokes a key (the row stays: usage and the audit log keep naming it) and deactivates
a user (their records stay; their keys stop working at once); neither is listed afterwards.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.http import QueryDict
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.exceptions import ParseError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from api.errors import APIError, invalid_value_error
from api.protocol import body_too_large_error
from api.usage_api import (
    COST_GROUPS,
    ORGANIZATION_GROUPS,
    build_costs_page,
    build_usage_page,
    parse_costs_query,
    parse_usage_query,
)
from audit.models import AuditLogEntry
from keys import ids
from keys.errors import TooManyKeys
from keys.models import APIKey, ModelPrice, UserLimits

from . import audit_query
from . import serializers as shapes
from .authentication import AdminKeyAuthentication, HasAdminKey, insufficient_permissions
from .exceptions import validation_error
from .members import LastOwnerError, change_member
from .models import AdminAPIKey
from .pagination import OpenAIListPagination

User = get_user_model()


def not_found(kind: str, public_id: str) -> APIError:
    """The 404 for an id that names nothing (or nothing listed: a revoked key, a deactivated user)."""
    return APIError(f"No such {kind}: '{public_id}'.", status=404, param=None, code=None)


class JSONOnly(BaseContentNegotiation):
    """JSON whatever the ``Accept`` header says, as OpenAI answers (never DRF's browsable HTML, never a 406)."""

    def select_parser(self, request: Request, parsers: list[Any]) -> Any:
        return parsers[0]

    def select_renderer(self, request: Request, renderers: list[Any], format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class StrictJSONParser(JSONParser):
    """DRF's JSON parser, with a body nested past Python's recursion limit a parse error (a 400), as
    ``/v1/completions`` answers it, instead of an uncaught ``RecursionError`` (a 500)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


class OrganizationViewSet(viewsets.GenericViewSet):
    """What every Administration API view shares: admin-key auth, JSON in and out, OpenAI's lists.

    No ``OPTIONS`` metadata (``metadata_class = None``: a 405 like any other method a route does
    not take); DRF's would describe the serializer of each view, which these views do not declare.
    """

    authentication_classes = [AdminKeyAuthentication]
    permission_classes = [HasAdminKey]
    renderer_classes = [JSONRenderer]
    parser_classes = [StrictJSONParser]
    content_negotiation_class = JSONOnly
    pagination_class = OpenAIListPagination
    metadata_class = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """DRF's checks (the admin key first), then no NUL character in a query parameter: a 400
        naming it.  PostgreSQL refuses NUL in a query's strings (a ``ValueError``: a 500), and no id,
        e-mail address or filter value of ours holds one."""
        super().initial(request, *args, **kwargs)
        self.read_chunked_body(request)
        for name, values in request.query_params.lists():
            bad = next((value for value in values if "\x00" in value), None)
            if bad is not None:
                raise invalid_value_error(name.removesuffix("[]"), bad, why="Null characters are not allowed.")

    @staticmethod
    def read_chunked_body(request: Request) -> None:
        """Give a body sent without ``Content-Length`` (``Transfer-Encoding: chunked``) its length.

        DRF takes a request without one for a request without a body (``request.data`` is ``{}``),
        so a chunked change answered 200 having changed nothing; the ASGI handler has read the whole
        body, as ``/v1/completions`` reads it.  Over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` it is the same 413
        as a body with a length over it (``exceptions``).
        """
        meta = request._request.META
        if meta.get("CONTENT_LENGTH") or request.method not in ("POST", "PUT", "PATCH", "DELETE"):
            return
        body = request._request.body  # Django checks no size without a length: we do
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and len(body) > limit:
            raise body_too_large_error(limit)
        if body:
            meta["CONTENT_LENGTH"] = str(len(body))

    def validated(self, serializer_class: type[shapes.RequestSerializer]) -> dict[str, Any]:
        """The request body validated by ``serializer_class``; a 400 naming the first bad field."""
        data = self.request.data
        if isinstance(data, QueryDict):  # no body at all
            data = {}
        serializer = serializer_class(data=data, context=self.get_serializer_context())
        if not serializer.is_valid():
            raise validation_error(serializer.errors, data, serializer)
        return dict(serializer.validated_data)

    def listed(self, queryset: QuerySet, serializer_class: type) -> Response:
        """One page of ``queryset`` in OpenAI's list shape."""
        page = self.paginate_queryset(queryset)
        assert page is not None
        return self.get_paginated_response(serializer_class(page, many=True).data)

    def cursor_pk(self, public_id: str) -> int | None:
        """The primary key of the object named by a list's ``after`` (see ``pagination``)."""
        raise NotImplementedError

    def active_user(self, public_id: str) -> Any:
        """The active user named ``user_{pk}``, or a 404."""
        pk = ids.parse_user_id(public_id)
        user = User.objects.filter(pk=pk, is_active=True).first() if pk is not None else None
        if user is None:
            raise not_found("user", public_id)
        return user

    def refuse_self_demotion(self, user: Any, param: str | None) -> None:
        """An admin key cannot take staff away from its own owner: it would lock itself out."""
        if user.pk == self.request.user.pk:
            raise APIError(
                "The owner of the admin key making this request cannot be demoted or deleted with it; "
                "use another owner's admin key.",
                param=param,
                code="invalid_value",
            )

    def change_member(self, user: Any, param: str | None, **changes: bool) -> None:
        """``members.change_member``, its refusal to remove the last active owner a 400 naming ``param``."""
        try:
            change_member(user, **changes)
        except LastOwnerError:
            raise APIError(
                f"User '{ids.user_id(user.pk)}' is the organization's last active owner; make another user "
                "an owner first, or the organization's admin keys would all stop working.",
                param=param,
                code="invalid_value",
            ) from None


# --- Admin keys -----------------------------------------------------------------------------------


class AdminApiKeyViewSet(OrganizationViewSet):
    """``/v1/organization/admin_api_keys[/{key_id}]``: list, create, retrieve, delete (revoke)."""

    def cursor_pk(self, public_id: str) -> int | None:
        prefix = ids.key_prefix(public_id)
        return AdminAPIKey.objects.filter(prefix=prefix).values_list("pk", flat=True).first() if prefix else None

    def admin_key(self, key_id: str) -> AdminAPIKey:
        """The unrevoked admin key named ``key_{prefix}``, or a 404."""
        prefix = ids.key_prefix(key_id)
        admin_key = (
            AdminAPIKey.objects.unrevoked().select_related("owner").filter(prefix=prefix).first() if prefix else None
        )
        if admin_key is None:
            raise not_found("admin API key", key_id)
        return admin_key

    @extend_schema(operation_id="admin-api-keys-list", responses=shapes.AdminApiKeySerializer(many=True))
    def list(self, request: Request) -> Response:
        """The admin keys not deleted (revoked), expired ones included, oldest first."""
        return self.listed(AdminAPIKey.objects.unrevoked().select_related("owner"), shapes.AdminApiKeySerializer)

    @extend_schema(
        operation_id="admin-api-keys-create",
        request=shapes.AdminApiKeyCreateRequestSerializer,
        responses=shapes.AdminApiKeyCreateResponseSerializer,
    )
    def create(self, request: Request) -> Response:
        """A new admin key for the caller's owner, of ``scope`` (default ``owner``) no higher than the
        caller's (else a 403 ``insufficient_permissions``); its ``value`` is in this answer only."""
        fields = self.validated(shapes.AdminApiKeyCreateRequestSerializer)
        if not request.auth.may_grant(fields["scope"]):
            raise insufficient_permissions(
                f"An admin key with the {request.auth.scope} scope cannot create a key with the {fields['scope']} "
                "scope.",
                param="scope",
            )
        seconds = fields.get("expires_in_seconds")
        expires_at = timezone.now() + timedelta(seconds=seconds) if seconds else None
        admin_key, plaintext = AdminAPIKey.objects.create_key(
            name=fields["name"], owner=request.user, expires_at=expires_at, scope=fields["scope"]
        )
        admin_key.value = plaintext  # type: ignore[attr-defined]  # the create response's one sight of the secret
        return Response(shapes.AdminApiKeyCreateResponseSerializer(admin_key).data)

    @extend_schema(operation_id="admin-api-keys-get", responses=shapes.AdminApiKeySerializer)
    def retrieve(self, request: Request, key_id: str) -> Response:
        """One admin key (never its value)."""
        return Response(shapes.AdminApiKeySerializer(self.admin_key(key_id)).data)

    @extend_schema(operation_id="admin-api-keys-delete", responses={200: shapes.AdminApiKeyDeleteResponseSerializer})
    def destroy(self, request: Request, key_id: str) -> Response:
        """Revoke the key; the next request with it is a 401 (the caller's own key too)."""
        admin_key = self.admin_key(key_id)
        admin_key.revoke()
        return Response({"id": admin_key.public_id, "object": "organization.admin_api_key.deleted", "deleted": True})


# --- Users ----------------------------------------------------------------------------------------


class UserViewSet(OrganizationViewSet):
    """``/v1/organization/users[/{user_id}]``: list, create (our extension), retrieve, modify, delete."""

    def cursor_pk(self, public_id: str) -> int | None:
        pk = ids.parse_user_id(public_id)
        return pk if pk is not None and User.objects.filter(pk=pk).exists() else None

    @extend_schema(
        operation_id="list-users",
        responses=shapes.UserSerializer(many=True),
        parameters=[OpenApiParameter("emails", str, many=True, description="Only users with these e-mail addresses.")],
    )
    def list(self, request: Request) -> Response:
        """The active users, oldest first; ``emails`` (or the client's ``emails[]``) keeps those addresses."""
        users = User.objects.filter(is_active=True)
        emails = request.query_params.getlist("emails") + request.query_params.getlist("emails[]")
        if emails:
            users = users.filter(email__in=emails)
        return self.listed(users, shapes.UserSerializer)

    @extend_schema(
        operation_id="create-user", request=shapes.UserCreateRequestSerializer, responses=shapes.UserSerializer
    )
    def create(self, request: Request) -> Response:
        """A new user (our extension: OpenAI invites by e-mail); without a password they cannot log in."""
        fields = self.validated(shapes.UserCreateRequestSerializer)
        first, _, last = fields.get("name", "").strip().partition(" ")
        try:
            with transaction.atomic():
                user = User.objects.create_user(
                    username=fields["username"],
                    email=fields.get("email", ""),
                    password=fields.get("password"),  # None: an unusable password
                    first_name=first,
                    last_name=last,
                    is_staff=fields["role"] == "owner",
                )
        except IntegrityError:
            # Another request took the username after the serializer checked it: the same 400.
            if not User.objects.filter(username=fields["username"]).exists():
                raise
            raise invalid_value_error(
                "username", fields["username"], why="A user with that username already exists."
            ) from None
        return Response(shapes.UserSerializer(user).data)

    @extend_schema(operation_id="retrieve-user", responses=shapes.UserSerializer)
    def retrieve(self, request: Request, user_id: str) -> Response:
        """One active user."""
        return Response(shapes.UserSerializer(self.active_user(user_id)).data)

    @extend_schema(
        operation_id="modify-user", request=shapes.UserRoleUpdateRequestSerializer, responses=shapes.UserSerializer
    )
    def update(self, request: Request, user_id: str) -> Response:
        """Set the role: ``owner`` makes the user staff, ``reader`` a plain user."""
        user = self.active_user(user_id)
        role = self.validated(shapes.UserRoleUpdateRequestSerializer)["role"]
        if role == "reader":
            self.refuse_self_demotion(user, "role")
        self.change_member(user, "role", is_staff=role == "owner")
        return Response(shapes.UserSerializer(user).data)

    @extend_schema(operation_id="delete-user", responses={200: shapes.UserDeleteResponseSerializer})
    def destroy(self, request: Request, user_id: str) -> Response:
        """Deactivate the user: their keys are refused from the next request, their records stay."""
        user = self.active_user(user_id)
        self.refuse_self_demotion(user, None)
        self.change_member(user, None, is_active=False)
        return Response({"object": "organization.user.deleted", "id": user_id, "deleted": True})


# --- A user's API keys and their rate limits (users as OpenAI's projects) -------------------------


class UserKeysViewSet(OrganizationViewSet):
    """What the two views of a user's API keys share: the user (``project_id``) and their keys."""

    def keys_of(self, user: Any) -> QuerySet[APIKey]:
        """The user's keys that are not revoked (a revoked key is deleted, for this API)."""
        return APIKey.objects.filter(owner=user, revoked_at__isnull=True).select_related("owner")

    def key(self, project_id: str, public_id: str, rate_limit: bool = False) -> APIKey:
        """The user's unrevoked key named ``key_{prefix}`` (``rl_{prefix}`` for its ``rate_limit``), or a 404."""
        user = self.active_user(project_id)
        prefix = ids.rate_limit_prefix(public_id) if rate_limit else ids.key_prefix(public_id)
        api_key = self.keys_of(user).filter(prefix=prefix).first() if prefix else None
        if api_key is None:
            raise not_found("rate limit" if rate_limit else "API key", public_id)
        return api_key

    def change(self, api_key: APIKey, columns: dict[str, Any], public_id: str) -> None:
        """Save ``columns`` on the key's row, which every process reads on the key's next request.

        A key revoked since it was read is a 404 (``APIKey.save`` refuses to write over a revocation).
        """
        for column, value in columns.items():
            setattr(api_key, column, value)
        if not columns:
            return
        try:
            api_key.save(update_fields=list(columns))
        except ValueError:
            raise not_found("API key", public_id) from None

    def cursor_pk(self, public_id: str) -> int | None:
        prefix = ids.rate_limit_prefix(public_id) or ids.key_prefix(public_id)
        user_pk = ids.parse_user_id(self.kwargs["project_id"])
        return APIKey.objects.filter(prefix=prefix, owner_id=user_pk).values_list("pk", flat=True).first()


def _key_columns(fields: dict[str, Any]) -> dict[str, Any]:
    """A key request's fields as ``APIKey`` columns (only those present)."""
    columns = shapes.limit_columns(fields)
    if "name" in fields:
        columns["name"] = fields["name"]
    if "models" in fields:
        columns["allowed_models"] = ",".join(fields["models"])
    if "expires_at" in fields:
        seconds = fields["expires_at"]
        columns["expires_at"] = None if seconds is None else datetime.fromtimestamp(seconds, tz=dt_timezone.utc)
    if "expires_in_seconds" in fields:
        columns["expires_at"] = timezone.now() + timedelta(seconds=fields["expires_in_seconds"])
    return columns


class ProjectApiKeyViewSet(UserKeysViewSet):
    """``/v1/organization/projects/{user_id}/api_keys[/{api_key_id}]``: a user's keys.

    List, retrieve, delete (revoke) in the spec's ``ProjectApiKey`` shape; create and modify are our
    extensions, with every per-key field of the admin.  A change is saved on the key's row, which
    every server process reads on each request, so it applies to the key's next request.
    """

    @extend_schema(operation_id="list-project-api-keys", responses=shapes.ProjectApiKeySerializer(many=True))
    def list(self, request: Request, project_id: str) -> Response:
        """The user's keys not deleted (revoked), expired ones included, oldest first."""
        return self.listed(self.keys_of(self.active_user(project_id)), shapes.ProjectApiKeySerializer)

    @extend_schema(
        operation_id="create-project-api-key",
        request=shapes.ProjectApiKeyCreateRequestSerializer,
        responses=shapes.ProjectApiKeyCreateResponseSerializer,
    )
    def create(self, request: Request, project_id: str) -> Response:
        """A new key for the user, working at once; its ``value`` is in this answer only."""
        user = self.active_user(project_id)
        columns = _key_columns(self.validated(shapes.ProjectApiKeyCreateRequestSerializer))
        try:
            api_key, plaintext = APIKey.objects.create_key(owner=user, **columns)
        except TooManyKeys as error:
            raise APIError(str(error), status=400, param=None, code="too_many_api_keys") from None
        api_key.value = plaintext  # type: ignore[attr-defined]  # the create response's one sight of the secret
        return Response(shapes.ProjectApiKeyCreateResponseSerializer(api_key).data)

    @extend_schema(operation_id="retrieve-project-api-key", responses=shapes.ProjectApiKeySerializer)
    def retrieve(self, request: Request, project_id: str, api_key_id: str) -> Response:
        """One of the user's keys (never its value)."""
        return Response(shapes.ProjectApiKeySerializer(self.key(project_id, api_key_id)).data)

    @extend_schema(
        operation_id="modify-project-api-key",
        request=shapes.ProjectApiKeyUpdateRequestSerializer,
        responses=shapes.ProjectApiKeySerializer,
    )
    def update(self, request: Request, project_id: str, api_key_id: str) -> Response:
        """Change any of the key's fields; the next request with the key sees the change."""
        api_key = self.key(project_id, api_key_id)
        self.change(api_key, _key_columns(self.validated(shapes.ProjectApiKeyUpdateRequestSerializer)), api_key_id)
        return Response(shapes.ProjectApiKeySerializer(api_key).data)

    @extend_schema(operation_id="delete-project-api-key", responses={200: shapes.ProjectApiKeyDeleteResponseSerializer})
    def destroy(self, request: Request, project_id: str, api_key_id: str) -> Response:
        """Revoke the key: its next request is a 401."""
        api_key = self.key(project_id, api_key_id)
        api_key.revoke()
        return Response(
            {"object": "organization.project.api_key.deleted", "id": shapes.api_key_id(api_key), "deleted": True}
        )


class ProjectRateLimitViewSet(UserKeysViewSet):
    """``/v1/organization/projects/{user_id}/rate_limits[/{rate_limit_id}]``: the rate limits of the
    user's keys, list and update.

    The spec's ``ProjectRateLimit`` is per model; here each key has one for its limits over all models
    (``rl_{prefix}``), then one for each model it has requests and tokens per minute of its own for
    (``rl_{prefix}:{model}``, ``APIKey.model_limits``), listed after it.  A list's ``limit`` counts
    keys: a key's rate limits are never split over two pages.  Updating ``rl_{prefix}:{model}`` sets
    (or, all ``null``, removes) the key's limits for that model, whether it had some or not.
    """

    @extend_schema(operation_id="list-project-rate-limits", responses=shapes.ProjectRateLimitSerializer(many=True))
    def list(self, request: Request, project_id: str) -> Response:
        """The limits in force of each of the user's keys, oldest key first, each followed by its own per model."""
        page = self.paginate_queryset(self.keys_of(self.active_user(project_id)))
        assert page is not None
        limits = [limit for api_key in page for limit in shapes.RateLimit.all_of(api_key)]
        return self.get_paginated_response(shapes.ProjectRateLimitSerializer(limits, many=True).data)

    @extend_schema(
        operation_id="update-project-rate-limits",
        request=shapes.ProjectRateLimitUpdateRequestSerializer,
        responses=shapes.ProjectRateLimitSerializer,
    )
    def update(self, request: Request, project_id: str, rate_limit_id: str) -> Response:
        """Set the key's own limits (``null``: the site's default; ``0``: none), from its next request;
        or, for ``rl_{prefix}:{model}``, its requests and tokens per minute for that model."""
        api_key = self.key(project_id, rate_limit_id, rate_limit=True)
        _, model = ids.parse_rate_limit_id(rate_limit_id) or ("", "")
        if model:
            fields = self.validated(shapes.ModelRateLimitUpdateRequestSerializer)
            changes = {name: fields[field] for field, name in MODEL_LIMIT_FIELDS.items() if field in fields}
            with transaction.atomic():  # the row locked: two models' updates of one key both land
                api_key = APIKey.objects.select_for_update().get(pk=api_key.pk)
                try:
                    limits = api_key.with_model_limits(model, changes)
                except DjangoValidationError:
                    raise not_found("rate limit", rate_limit_id) from None
                self.change(api_key, {"model_limits": limits}, rate_limit_id)
        else:
            columns = _key_columns(self.validated(shapes.ProjectRateLimitUpdateRequestSerializer))
            self.change(api_key, columns, rate_limit_id)
        return Response(shapes.ProjectRateLimitSerializer(shapes.RateLimit(api_key, model)).data)


# The Administration API's per-model rate limit fields and APIKey.model_limits' names for them.
MODEL_LIMIT_FIELDS = {"max_requests_per_1_minute": "rpm", "max_tokens_per_1_minute": "tpm"}


# --- The audit log and everyone's usage -----------------------------------------------------------


class AuditLogViewSet(OrganizationViewSet):
    """``GET /v1/organization/audit_logs``: OpenAI's ``list-audit-logs``, newest first.

    ``after=<last_id>`` gives the next (older) page, ``before=<first_id>`` the previous (newer) one;
    the filters are ``organization.audit_query``'s.  Entries come from every surface (this API, the
    admin, the account pages, the command line; ``audit.receivers``).
    """

    list_newest_first = True
    list_pages_back = True

    def cursor_pk(self, public_id: str) -> int | None:
        return AuditLogEntry.objects.filter(public_id=public_id).values_list("pk", flat=True).first()

    @extend_schema(
        operation_id="list-audit-logs",
        responses=shapes.AuditLogSerializer(many=True),
        parameters=[
            OpenApiParameter("event_types[]", str, many=True, description="Only these event types."),
            OpenApiParameter("actor_ids[]", str, many=True, description="Only these actors (user_…, key_…, system)."),
            OpenApiParameter("resource_ids[]", str, many=True, description="Only about these (key_…, user_…)."),
            OpenApiParameter(
                "project_ids[]",
                str,
                many=True,
                description="Users stand for projects: only about these users (user_…) or their API keys.",
            ),
            *(
                OpenApiParameter(f"effective_at[{bound}]", int, description=f"Unix seconds: effective_at {bound}.")
                for bound in ("gt", "gte", "lt", "lte")
            ),
        ],
    )
    def list(self, request: Request) -> Response:
        """The audit log's entries, newest first, filtered by type, actor, resource and time."""
        return self.listed(
            audit_query.filtered(AuditLogEntry.objects.all(), request.query_params), shapes.AuditLogSerializer
        )


class UsageCompletionsViewSet(OrganizationViewSet):
    """``GET /v1/organization/usage/completions``: everyone's usage in OpenAI's ``UsageResponse``.

    The same buckets, pages and parameter errors as the key-scoped ``GET /v1/usage/completions``
    (one implementation, ``api.usage_api``), over every key of every user, with ``group_by``
    ``user_id`` and the ``user_ids`` and ``project_ids`` filters (users are projects here) besides
    ``model``, ``api_key_id``, ``models`` and ``api_key_ids``.
    """

    @extend_schema(
        operation_id="usage-completions",
        responses=shapes.UsageResponseSerializer,
        parameters=[
            OpenApiParameter("start_time", int, required=True, description="Unix seconds, inclusive."),
            OpenApiParameter("end_time", int, description="Unix seconds, exclusive (default: now)."),
            OpenApiParameter("bucket_width", str, enum=["1m", "1h", "1d"], description="Default 1d."),
            OpenApiParameter("group_by[]", str, many=True, enum=list(ORGANIZATION_GROUPS)),
            OpenApiParameter("user_ids[]", str, many=True),
            OpenApiParameter("project_ids[]", str, many=True, description="Users stand for projects: user_… ids."),
            OpenApiParameter("api_key_ids[]", str, many=True),
            OpenApiParameter("models[]", str, many=True),
            OpenApiParameter("limit", int, description="Buckets per page."),
            OpenApiParameter("page", str, description="The previous answer's next_page."),
        ],
    )
    def retrieve(self, request: Request) -> Response:
        """Token and request counts per time bucket, grouped and filtered by user, key and model."""
        # Rounded up: without an end_time, a request made this very second is included.
        query = parse_usage_query(request.query_params, now=math.ceil(time.time()), organization=True)
        return Response(build_usage_page(query))


class CostsViewSet(OrganizationViewSet):
    """``GET /v1/organization/costs``: OpenAI's costs, daily, from the usage records' costs
    (``keys.pricing``; one implementation with the key-scoped ``GET /v1/costs``, ``api.usage_api``)."""

    @extend_schema(
        operation_id="usage-costs",
        responses=shapes.CostsResponseSerializer,
        parameters=[
            OpenApiParameter("start_time", int, required=True, description="Unix seconds, inclusive."),
            OpenApiParameter("end_time", int, description="Unix seconds, exclusive (default: now)."),
            OpenApiParameter("bucket_width", str, enum=["1d"], description="Only 1d, as OpenAI."),
            OpenApiParameter("group_by[]", str, many=True, enum=list(COST_GROUPS)),
            OpenApiParameter("project_ids[]", str, many=True, description="Users stand for projects: user_… ids."),
            OpenApiParameter("limit", int, description="Buckets per page (at most 180)."),
            OpenApiParameter("page", str, description="The previous answer's next_page."),
        ],
    )
    def retrieve(self, request: Request) -> Response:
        """Cost per day, grouped by model (``line_item``) and user (``project_id``)."""
        query = parse_costs_query(request.query_params, now=math.ceil(time.time()), organization=True)
        return Response(build_costs_page(query))


# --- Our extensions: a user's limits across their keys, and the model prices -----------------------


class UserLimitsViewSet(OrganizationViewSet):
    """``/v1/organization/users/{user_id}/limits``: a user's limits across all their keys (our extension)."""

    def own_limits(self, user_id: str) -> UserLimits:
        """The user's row, or an unsaved one with every field empty (the defaults)."""
        user = self.active_user(user_id)
        return UserLimits.objects.filter(user=user).first() or UserLimits(user=user)

    @extend_schema(operation_id="retrieve-user-limits", responses=shapes.UserLimitsSerializer)
    def retrieve(self, request: Request, user_id: str) -> Response:
        """The user's own limits (``null``: the default) and those in force."""
        return Response(shapes.UserLimitsSerializer(self.own_limits(user_id)).data)

    @extend_schema(
        operation_id="modify-user-limits",
        request=shapes.UserLimitsUpdateRequestSerializer,
        responses=shapes.UserLimitsSerializer,
    )
    def update(self, request: Request, user_id: str) -> Response:
        """Set any of the user's limits, from their next request (a key cap from their next key)."""
        own = self.own_limits(user_id)
        columns = shapes.limit_columns(
            self.validated(shapes.UserLimitsUpdateRequestSerializer), shapes.USER_LIMIT_COLUMNS
        )
        for column, value in columns.items():
            setattr(own, column, value)
        own.save()
        return Response(shapes.UserLimitsSerializer(own).data)


class ModelPriceViewSet(OrganizationViewSet):
    """``/v1/organization/model_prices[/{model}]``: prices per million tokens (our extension).

    ``POST`` sets a model's prices (creating its row the first time); a change applies to requests
    admitted after it, and usage records keep the cost they were written with.
    """

    def cursor_pk(self, public_id: str) -> int | None:
        return ModelPrice.objects.filter(model=public_id).values_list("pk", flat=True).first()

    def price(self, model: str) -> ModelPrice:
        found = ModelPrice.objects.filter(model=model).first()
        if found is None:
            raise not_found("model price", model)
        return found

    @extend_schema(operation_id="list-model-prices", responses=shapes.ModelPriceSerializer(many=True))
    def list(self, request: Request) -> Response:
        """Every model's prices, in the order they were first set."""
        return self.listed(ModelPrice.objects.all(), shapes.ModelPriceSerializer)

    @extend_schema(
        operation_id="set-model-price",
        request=shapes.ModelPriceRequestSerializer,
        responses=shapes.ModelPriceSerializer,
    )
    def create(self, request: Request) -> Response:
        """Set one model's prices."""
        fields = self.validated(shapes.ModelPriceRequestSerializer)
        price, _ = ModelPrice.objects.update_or_create(model=fields.pop("model"), defaults=fields)
        return Response(shapes.ModelPriceSerializer(price).data)

    @extend_schema(operation_id="retrieve-model-price", responses=shapes.ModelPriceSerializer)
    def retrieve(self, request: Request, model: str) -> Response:
        """One model's prices."""
        return Response(shapes.ModelPriceSerializer(self.price(model)).data)

    @extend_schema(operation_id="delete-model-price", responses={200: shapes.ModelPriceDeleteResponseSerializer})
    def destroy(self, request: Request, model: str) -> Response:
        """Remove a model's prices: its requests cost nothing from now on."""
        self.price(model).delete()
        return Response({"object": "organization.model_price.deleted", "model": model, "deleted": True})
