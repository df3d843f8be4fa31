"""Who may call the Administration API: a Bearer admin key, and nothing else.

:class:`AdminKeyAuthentication` is DRF's authentication class for every ``/v1/organization/`` route.
An admin key (``sk-cs-admin-...``) that is active, whose owner is an active staff user,
authenticates the request: ``request.user`` is the owner, ``request.auth`` the
:class:`~organization.models.AdminAPIKey`, and ``request.audit_actor`` the same key (the hook the
audit log reads to name the actor).  The errors are OpenAI's 401s (``api.translate``'s words):
``code: null`` without a Bearer token, ``invalid_api_key`` for any bad admin key (unknown,
malformed, revoked, expired, wrong secret, owner no longer staff), the same for all of them.  An
API key (``sk-cs-...``) is a 403: it is a real credential, of the wrong kind.  API keys' own
authentication (``keys.auth``) never accepts an admin key, whose shape is not an API key's.

:class:`HasAdminKey` then checks the key's scope: a read-only key may ``GET`` (and ``HEAD``) every
route, and any other method anywhere is a 403 ``insufficient_permissions``, before the body is read.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import SAFE_METHODS, BasePermission

from api.errors import APIError
from api.translate import auth_error
from keys.auth import bearer_token
from keys.errors import AuthFailed
from keys.models import KEY_NAMESPACE

from .models import ADMIN_KEY_NAMESPACE, AdminAPIKey, parse_admin_prefix

logger = logging.getLogger(__name__)

LAST_USED_RESOLUTION = timedelta(seconds=60)
API_KEY_REFUSED_MESSAGE = (
    "API keys cannot call the Administration API; use an admin key (sk-cs-admin-...), which "
    "`manage.py create_admin_key` or the admin creates."
)


class AdminKeyAuthentication(BaseAuthentication):
    """``Authorization: Bearer sk-cs-admin-...`` to ``(owner, admin key)``, in one query.

    Raises :class:`~api.errors.APIError` (the exception handler answers it): 401 for a missing or
    bad admin key, 403 for an API key.
    """

    def authenticate(self, request):
        """DRF's hook: ``(user, admin_key)``; never ``None`` (there is no other way in)."""
        try:
            token = bearer_token(request.headers.get("Authorization"))
        except AuthFailed as error:
            raise auth_error(error) from None
        prefix = parse_admin_prefix(token)
        if prefix is None:
            if token.startswith(KEY_NAMESPACE) and not token.startswith(ADMIN_KEY_NAMESPACE):
                raise APIError(API_KEY_REFUSED_MESSAGE, status=403, code="insufficient_permissions")
            raise _rejected("malformed token", None)
        admin_key = AdminAPIKey.objects.select_related("owner").filter(prefix=prefix).first()
        if admin_key is None:
            raise _rejected("unknown prefix", prefix)
        reason = _rejection_reason(admin_key, token)
        if reason:
            raise _rejected(reason, prefix)
        _touch_last_used(admin_key)
        # The audit log's hook: who acts (the DRF request, and Django's beneath it for signals).
        request.audit_actor = admin_key
        request._request.audit_actor = admin_key
        return admin_key.owner, admin_key

    def authenticate_header(self, request) -> str:
        """The 401's challenge (without it DRF would turn a 401 into a 403)."""
        return "Bearer"


READ_ONLY_REFUSED_MESSAGE = (
    "You have insufficient permissions for this operation: this admin key is read-only, so it may only read "
    "(GET). Use an admin key with the owner scope."
)


class HasAdminKey(BasePermission):
    """Allows a request that :class:`AdminKeyAuthentication` authenticated, within its key's scope.

    Raises :class:`~api.errors.APIError` 403 ``insufficient_permissions`` for a read-only key and a
    method that may change something (anything but ``GET``, ``HEAD``, ``OPTIONS``).
    """

    def has_permission(self, request, view) -> bool:
        admin_key = request.auth
        if not isinstance(admin_key, AdminAPIKey):
            return False
        if admin_key.is_read_only and request.method not in SAFE_METHODS:
            raise insufficient_permissions(READ_ONLY_REFUSED_MESSAGE)
        return True


def insufficient_permissions(message: str, param: str | None = None) -> APIError:
    """OpenAI's 403 for a credential that may not do what it asks."""
    return APIError(message, status=403, param=param, code="insufficient_permissions")


def _rejection_reason(admin_key: AdminAPIKey, token: str) -> str | None:
    """Why a found admin key does not authenticate ``token``, or ``None`` when it does."""
    if not admin_key.verify(token):  # first and always: the timing says nothing of the status
        return "wrong secret"
    if admin_key.is_revoked:
        return "revoked"
    if admin_key.is_expired:
        return "expired"
    if not (admin_key.owner.is_active and admin_key.owner.is_staff):
        return "owner is not active staff"
    return None


def _rejected(reason: str, prefix: str | None) -> APIError:
    logger.info("Admin key rejected: %s (prefix %s)", reason, prefix)
    return auth_error(AuthFailed(missing=False, reason=reason))


def _touch_last_used(admin_key: AdminAPIKey) -> None:
    """Set ``last_used_at`` at most once a minute (one conditional UPDATE), as ``keys.auth`` does."""
    now = timezone.now()
    cutoff = now - LAST_USED_RESOLUTION
    if admin_key.last_used_at is not None and admin_key.last_used_at >= cutoff:
        return
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=cutoff)
    if AdminAPIKey.objects.filter(stale, pk=admin_key.pk).update(last_used_at=now):
        admin_key.last_used_at = now
