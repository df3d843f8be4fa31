"""Admin keys: the credentials of the Administration API (``/v1/organization/...``) and of nothing else.

An admin key's plaintext is ``sk-cs-admin-{prefix}.{secret}``, built like an API key
(``keys.models``): an 8-character public prefix stored in clear for one indexed lookup, a
``secrets.token_urlsafe(32)`` secret, and only ``sha256(plaintext)`` stored.  The plaintext is shown
once, when the key is created.  The namespace differs from API keys' ``sk-cs-``, and API keys'
pattern (``sk-cs-`` then 8 letters or digits then ``.``) cannot match an admin key, so neither kind
authenticates where the other is meant.

Deleting an admin key (the API's ``DELETE``, the admin's action) revokes it: the row stays, so that
an audit trail can still name it, and revocation is one-way as for API keys.

A key's ``scope`` is chosen when it is created and never changes (OpenAI's admin keys' permissions):
``owner`` may do anything the Administration API does, ``read_only`` may only read (``GET``); a key
can create keys of its own scope or a lower one (:meth:`AdminAPIKey.may_grant`).
"""

from __future__ import annotations

import re
from datetime import datetime

from django.conf import settings
from django.db import models

from keys.ids import api_key_id
from keys.models import PREFIX_LENGTH, AbstractKey, insert_with_fresh_prefix

ADMIN_KEY_NAMESPACE = "sk-cs-admin-"
_ADMIN_KEY_PATTERN = re.compile(
    rf"{re.escape(ADMIN_KEY_NAMESPACE)}(?P<prefix>[A-Za-z0-9]{{{PREFIX_LENGTH}}})\.[A-Za-z0-9_-]{{1,256}}"
)


def parse_admin_prefix(plaintext: str) -> str | None:
    """The prefix of a well-formed admin key, or ``None`` when ``plaintext`` is not shaped like one."""
    match = _ADMIN_KEY_PATTERN.fullmatch(plaintext)
    return match["prefix"] if match else None


class Scope(models.TextChoices):
    """What an admin key may do, lowest first (the order :meth:`AdminAPIKey.may_grant` compares)."""

    READ_ONLY = "read_only", "read-only"
    OWNER = "owner", "owner"


_SCOPE_RANK = {scope: rank for rank, scope in enumerate(Scope)}


class AdminAPIKeyQuerySet(models.QuerySet):
    """Status filters; "now" is evaluated per call."""

    def unrevoked(self) -> AdminAPIKeyQuerySet:
        """Keys not deleted (revoked): the ones the API lists, expired ones included."""
        return self.filter(revoked_at__isnull=True)


class AdminAPIKeyManager(models.Manager.from_queryset(AdminAPIKeyQuerySet)):  # type: ignore[misc]  # stubs: no dynamic bases
    """Creates admin keys; the plaintext exists only in the return value of :meth:`create_key`."""

    def create_key(
        self,
        *,
        name: str,
        owner: models.Model,
        expires_at: datetime | None = None,
        scope: str = Scope.OWNER,
    ) -> tuple[AdminAPIKey, str]:
        """Insert a new admin key for ``owner`` (a staff user) and return ``(row, plaintext)``."""
        admin_key = self.model(name=name, owner=owner, expires_at=expires_at, scope=scope)
        return admin_key, self.issue(admin_key)

    def issue(self, admin_key: AdminAPIKey) -> str:
        """Give the unsaved ``admin_key`` a fresh prefix and secret, insert it, return the plaintext.

        A prefix collision is retried (:func:`keys.models.insert_with_fresh_prefix`).
        """
        return insert_with_fresh_prefix(self, admin_key, ADMIN_KEY_NAMESPACE)


class AdminAPIKey(AbstractKey):
    """A Bearer credential of the Administration API, owned by a staff user (OpenAI's ``AdminApiKey``)."""

    name = models.CharField(max_length=100, help_text="What the key is for, e.g. “billing sync”.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="admin_api_keys",
        limit_choices_to={"is_staff": True},
        help_text="The staff user the key acts for.",
    )
    prefix = models.CharField(max_length=PREFIX_LENGTH, unique=True, editable=False)
    scope = models.CharField(
        max_length=16,
        choices=Scope.choices,
        default=Scope.OWNER,
        help_text="Owner: every call of the Administration API. Read-only: reads (GET) only.",
    )

    objects = AdminAPIKeyManager()

    class Meta:
        verbose_name = "admin API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({ADMIN_KEY_NAMESPACE}{self.prefix}…)"

    @property
    def public_id(self) -> str:
        """The id the API names it by: ``key_{prefix}`` (OpenAI's ``key_abc``)."""
        return api_key_id(self.prefix)

    @property
    def redacted_value(self) -> str:
        """``sk-cs-admin-{prefix}...``: the public part only (the secret is not stored)."""
        return f"{ADMIN_KEY_NAMESPACE}{self.prefix}..."

    @property
    def is_read_only(self) -> bool:
        """Whether the key may only read (``GET``) the Administration API."""
        return self.scope == Scope.READ_ONLY

    def may_grant(self, scope: str) -> bool:
        """Whether this key may create a key of ``scope``: its own scope or a lower one."""
        return _SCOPE_RANK[Scope(scope)] <= _SCOPE_RANK[Scope(self.scope)]
