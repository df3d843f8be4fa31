"""Audit log entries in the shape of OpenAI's ``AuditLog`` (``GET /organization/audit_logs``).

One row per event: its public ``id`` (``audit_log-...``), ``type`` (one of :data:`EVENT_TYPES`),
``effective_at``, the ``actor`` (who did it, see ``audit.context``) and the per-type payload,
which the API shows under a key named after the type, e.g.
``{"type": "api_key.updated", "api_key.updated": {"id": "key_AbCd1234", "changes_requested": {...}}}``.

``actor_id`` and ``resource_id`` are copies of the actor's and the object's public ids, indexed,
for the list endpoint's ``actor_ids[]`` and ``resource_ids[]`` filters.  Rows are never changed:
the admin shows them read-only.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.db import models
from django.utils import timezone

ID_PREFIX = "audit_log-"

API_KEY_CREATED = "api_key.created"
API_KEY_UPDATED = "api_key.updated"
API_KEY_DELETED = "api_key.deleted"
USER_ADDED = "user.added"
USER_UPDATED = "user.updated"
USER_DELETED = "user.deleted"
LOGIN_SUCCEEDED = "login.succeeded"
LOGIN_FAILED = "login.failed"
# The spec's AuditLogEventType values this server records.
EVENT_TYPES = (
    API_KEY_CREATED,
    API_KEY_UPDATED,
    API_KEY_DELETED,
    USER_ADDED,
    USER_UPDATED,
    USER_DELETED,
    LOGIN_SUCCEEDED,
    LOGIN_FAILED,
)


def new_public_id() -> str:
    """``audit_log-`` and 16 random URL-safe characters."""
    return ID_PREFIX + secrets.token_urlsafe(12)


class AuditLogEntry(models.Model):
    """One recorded event; :meth:`to_dict` gives its ``AuditLog`` JSON."""

    public_id = models.CharField(max_length=40, unique=True, default=new_public_id, editable=False)
    type = models.CharField(max_length=40, choices=[(name, name) for name in EVENT_TYPES], db_index=True)
    effective_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor_type = models.CharField(max_length=20, help_text="session, api_key or system (ours: the command line).")
    actor_id = models.CharField(
        max_length=100, blank=True, db_index=True, help_text="user_…, an admin key's key_…, or system."
    )
    actor = models.JSONField(help_text="The spec's AuditLogActor object.")
    resource_id = models.CharField(max_length=100, blank=True, db_index=True, help_text="key_… or user_…")
    details = models.JSONField(default=dict, help_text="The payload shown under the event type's key.")

    class Meta:
        verbose_name = "audit log entry"
        verbose_name_plural = "audit log entries"
        ordering = ["-pk"]

    def __str__(self) -> str:
        return f"{self.type} {self.resource_id} ({self.public_id})"

    def to_dict(self) -> dict[str, Any]:
        """The spec's ``AuditLog``: ``id``, ``type``, ``effective_at`` (Unix seconds), ``actor`` and
        the payload under the type's name (``project`` is left out: we have no projects)."""
        return {
            "id": self.public_id,
            "type": self.type,
            "effective_at": int(self.effective_at.timestamp()),
            "actor": self.actor,
            self.type: self.details,
        }
