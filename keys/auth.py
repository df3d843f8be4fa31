"""Bearer API-key authentication for the async API views, with OpenAI's 401 responses.

OpenAI answers a missing credential and a bad one differently (``code: null`` vs
``code: "invalid_api_key"``); we do the same, but every bad key (unknown, malformed, revoked,
expired, wrong secret, deactivated owner) gets one identical response so that a caller learns
nothing about which keys exist.  The reason is logged for operators, with the public prefix only.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone

from api.errors import APIError

from .db import db_call
from .models import APIKey, parse_prefix

logger = logging.getLogger(__name__)

MISSING_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
INCORRECT_KEY_MESSAGE = "Incorrect API key provided."
# RFC 9110 requires a challenge on every 401; "Bearer" never makes a browser prompt for a password.
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
# last_used_at is for humans ("is this key still in use?"); one write a minute per key is plenty
# and keeps a busy key from turning every request into a database write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def missing_key_error() -> APIError:
    """The 401 for no Authorization header, an empty token or a scheme other than Bearer."""
    return APIError(MISSING_KEY_MESSAGE, status=401, type="invalid_request_error", code=None, headers=_CHALLENGE)


def incorrect_key_error() -> APIError:
    """The one 401 for every key that does not authenticate; it never echoes the key."""
    return APIError(
        INCORRECT_KEY_MESSAGE, status=401, type="invalid_request_error", code="invalid_api_key", headers=_CHALLENGE
    )


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value.

    The scheme is case-insensitive (RFC 9110 section 11.1) and surrounding whitespace is ignored.
    Raises :func:`missing_key_error` for ``None``, an empty token or another scheme.
    """
    parts = (authorization or "").split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "bearer" or not parts[1].strip():
        raise missing_key_error()
    return parts[1].strip()


async def authenticate(request: HttpRequest) -> APIKey:
    """The active :class:`APIKey` (with ``owner`` loaded) named by the request's Bearer token.

    Costs exactly one database query on success, none for a token not shaped like a key.
    Raises ``APIError`` (401): :func:`missing_key_error` or :func:`incorrect_key_error`.
    """
    token = bearer_token(request.headers.get("Authorization"))
    prefix = parse_prefix(token)
    if prefix is None:
        logger.info("API key rejected: malformed token")
        raise incorrect_key_error()
    # Read from the database on every request, never cached: a revocation, a new limit or a
    # new list of models applies to the next request on every process.
    api_key = await db_call(_find_key, prefix)
    if api_key is None:
        logger.info("API key rejected: unknown prefix %s", prefix)
        raise incorrect_key_error()
    reason = _rejection_reason(api_key, token)
    if reason:
        logger.info("API key rejected: %s (prefix %s)", reason, prefix)
        raise incorrect_key_error()
    return api_key


def _find_key(prefix: str) -> APIKey | None:
    """The key with ``prefix`` and its owner, in one query; ``None`` if there is none."""
    return APIKey.objects.select_related("owner").filter(prefix=prefix).first()


def _rejection_reason(api_key: APIKey, token: str) -> str | None:
    """Why a found key does not authenticate ``token``, or ``None`` when it does."""
    # The hash is compared first and always, so the timing does not depend on the key's status.
    if not api_key.verify(token):
        return "wrong secret"
    if api_key.is_revoked:
        return "revoked"
    if api_key.is_expired:
        return "expired"
    if not api_key.owner.is_active:
        return "owner deactivated"
    return None


async def touch_last_used(api_key: APIKey) -> bool:
    """Set ``api_key.last_used_at`` to now unless it was set within the last 60 seconds.

    One conditional ``UPDATE ... WHERE last_used_at IS NULL OR last_used_at < now - 60 s``, so
    concurrent requests write at most once a minute; no query at all when the loaded row is
    already recent.  Returns whether this call wrote.
    """
    now = timezone.now()
    cutoff = now - LAST_USED_RESOLUTION
    if api_key.last_used_at is not None and api_key.last_used_at >= cutoff:
        return False
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=cutoff)
    updated = await db_call(APIKey.objects.filter(stale, pk=api_key.pk).update, last_used_at=now)
    if updated:
        api_key.last_used_at = now
    return bool(updated)
