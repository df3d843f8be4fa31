"""Bearer API-key authentication: the ``Authorization`` header's value to an active key.

A missing credential and a bad one are told apart (:class:`~keys.errors.AuthFailed`'s
``missing``), as OpenAI's 401s do (``code: null`` vs ``code: "invalid_api_key"``); every bad key
(unknown, malformed, revoked, expired, wrong secret, deactivated owner) is one identical error so
that a caller learns nothing about which keys exist.  The reason is logged for operators, with
the public prefix only.  The API turns the error into its 401 (``api/auth.py``).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from .db import DATABASE_DOWN, db_call
from .errors import AuthFailed, DatabaseUnavailable
from .models import APIKey, parse_prefix

logger = logging.getLogger(__name__)

# last_used_at is for humans ("is this key still in use?"); one write a minute per key is plenty
# and keeps a busy key from turning every request into a database write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value.

    The scheme is case-insensitive (RFC 9110 section 11.1) and surrounding whitespace is ignored.
    Raises ``AuthFailed(missing=True)`` for ``None``, an empty token or another scheme.
    """
    parts = (authorization or "").split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "bearer" or not parts[1].strip():
        raise AuthFailed(missing=True)
    return parts[1].strip()


async def authenticate(authorization: str | None) -> APIKey:
    """The active :class:`APIKey` (with ``owner`` loaded) named by an ``Authorization`` header value.

    Costs exactly one database query on success, none for a token not shaped like a key.
    Raises :class:`~keys.errors.AuthFailed`: ``missing`` for no Bearer token, else incorrect;
    :class:`~keys.errors.DatabaseUnavailable` when the database does not answer (no key is served
    from memory meanwhile: docs/operations.md, "Reliability").
    """
    token = bearer_token(authorization)
    prefix = parse_prefix(token)
    if prefix is None:
        logger.info("API key rejected: malformed token")
        raise AuthFailed(missing=False, reason="malformed token")
    # Read from the database on every request, never cached: a revocation, a new limit or a
    # new list of models applies to the next request on every process.
    try:
        api_key = await db_call(_find_key, prefix)
    except DATABASE_DOWN as error:
        raise DatabaseUnavailable(error) from error
    if api_key is None:
        logger.info("API key rejected: unknown prefix %s", prefix)
        raise AuthFailed(missing=False, reason="unknown prefix")
    reason = _rejection_reason(api_key, token)
    if reason:
        logger.info("API key rejected: %s (prefix %s)", reason, prefix)
        raise AuthFailed(missing=False, reason=reason)
    return api_key


def _find_key(prefix: str) -> APIKey | None:
    """The key with ``prefix``, its owner and the owner's limits, in one query; ``None`` if there is none."""
    try:  # get(), not first(): no ORDER BY to compile and run on every request (prefix is unique)
        return APIKey.objects.select_related("owner", "owner__limits").get(prefix=prefix)
    except APIKey.DoesNotExist:
        return None


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
