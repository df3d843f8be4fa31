"""Signal receivers that turn changes of keys and users, and sign-ins, into audit entries.

What is recorded, and when (the actor is ``audit.context.current_actor()`` unless said):

- ``api_key.created``: a key is inserted (admin, account page, ``create_api_key``, the API).
  Payload ``{"id": "key_…", "data": {"scopes": [], "name", "user_id", and the key's limits}}``.
- ``api_key.updated``: a saved key's name, expiry, limits or models changed; ``changes_requested``
  holds the new values of what changed (``expires_at`` in Unix seconds).  A save that changes none
  of these (``last_used_at``) records nothing.
- ``api_key.deleted``: the key is **revoked** (``keys.signals.api_key_revoked``).  On OpenAI a
  deleted key stops working at once and for good, which is what revocation is here; the row stays
  for its usage history, so deleting a key on OpenAI maps to revoking one here.  Deleting the row of a
  key that was never revoked (the admin's delete, a user deleted with their keys) is recorded the
  same way; deleting a revoked key's row records nothing more.
- ``user.added`` / ``user.updated`` / ``user.deleted``: the user model's rows.  ``role`` is
  ``owner`` for staff and ``reader`` otherwise (the users API's mapping); ``changes_requested``
  also names our fields: ``username``, ``email``, ``first_name``, ``last_name``, ``is_active``,
  ``is_superuser``, and ``password: "changed"`` (never the hash).  A save of ``last_login`` alone
  records nothing.
- ``login.succeeded`` (actor: the person who signed in) and ``login.failed`` (actor: an
  anonymous session, or the account the username names; payload ``error_code``,
  ``error_message`` and our ``username``), from ``django.contrib.auth``'s signals, so the
  account login page and the admin's alike.  A wrong password is ``invalid_credentials``; the
  sign-in lock-out (django-axes, ``completions_site/signin.py``) adds one ``locked_out`` entry
  when it locks a username and address, and one for every sign-in it refuses while locked
  (whose password is never checked, so no ``invalid_credentials`` entry for it).

Entries are written in the transaction of the change, so a rolled-back change leaves none.
Fixture loading (``raw``) records nothing.
"""

from __future__ import annotations

from typing import Any

from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db.models import Model
from django.db.models.signals import post_delete, post_save, pre_save
from django.http import HttpRequest

from keys.ids import api_key_id, user_id
from keys.models import APIKey
from keys.signals import api_key_revoked

from . import models as events
from .context import Actor, actor_for, client_ip, current_actor, user_actor
from .models import AuditLogEntry

KEY_FIELDS = (
    "name",
    "expires_at",
    "rpm_limit",
    "tpm_limit",
    "max_concurrent",
    "monthly_token_quota",
    "allowed_models",
    "model_limits",
)
USER_FIELDS = ("username", "email", "first_name", "last_name", "is_active", "is_staff", "is_superuser", "password")
_BEFORE = "_audit_before"
LOGIN_FAILED_CODE = "invalid_credentials"
LOGIN_FAILED_MESSAGE = "The username or password was wrong, or the account is inactive."
LOCKED_OUT_CODE = "locked_out"
_REFUSED_BY_LOCKOUT = "_audit_refused_by_lockout"


def record(event_type: str, resource_id: str, details: dict[str, Any], actor: Actor | None = None) -> AuditLogEntry:
    """Write one entry of ``event_type`` about ``resource_id``, by ``actor`` (default: who acts now)."""
    actor = actor or current_actor()
    return AuditLogEntry.objects.create(
        type=event_type,
        actor_type=actor.type,
        actor_id=actor.id,
        actor=actor.to_dict(),
        resource_id=resource_id,
        details=details,
    )


def connect() -> None:
    """Connect every receiver (``AuditConfig.ready``); ``dispatch_uid`` keeps them single."""
    user_model = get_user_model()
    pre_save.connect(_remember_before, sender=APIKey, dispatch_uid="audit-key-before")
    post_save.connect(_key_saved, sender=APIKey, dispatch_uid="audit-key-saved")
    post_delete.connect(_key_deleted, sender=APIKey, dispatch_uid="audit-key-deleted")
    api_key_revoked.connect(_key_revoked, sender=APIKey, dispatch_uid="audit-key-revoked")
    pre_save.connect(_remember_before, sender=user_model, dispatch_uid="audit-user-before")
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="audit-user-saved")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid="audit-user-deleted")
    user_logged_in.connect(_logged_in, dispatch_uid="audit-login")
    user_login_failed.connect(_login_failed, dispatch_uid="audit-login-failed")
    user_locked_out.connect(_locked_out, dispatch_uid="audit-locked-out")


# --- Keys --------------------------------------------------------------------------------------


def _remember_before(
    sender: type[Model], instance: Any, raw: bool = False, update_fields: Any = None, **kwargs: Any
) -> None:
    """Before an update, keep the audited fields' stored values on the instance (one query)."""
    fields = KEY_FIELDS if sender is APIKey else USER_FIELDS
    if raw or instance._state.adding or instance.pk is None:
        return
    if update_fields is not None and not set(update_fields) & set(fields):
        return
    stored = sender._default_manager.filter(pk=instance.pk).values(*fields).first()
    setattr(instance, _BEFORE, stored)


def _changes(instance: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    before = instance.__dict__.pop(_BEFORE, None)
    if before is None:
        return {}
    return {name: getattr(instance, name) for name in fields if getattr(instance, name) != before[name]}


def _key_values(values: dict[str, Any]) -> dict[str, Any]:
    """Key fields as JSON: ``expires_at`` in Unix seconds, ``allowed_models`` as a list."""
    shown = dict(values)
    if "expires_at" in shown:
        shown["expires_at"] = int(shown["expires_at"].timestamp()) if shown["expires_at"] else None
    if "allowed_models" in shown:
        shown["allowed_models"] = [m.strip() for m in shown["allowed_models"].split(",") if m.strip()]
    return shown


def _key_saved(sender: type, instance: APIKey, created: bool, raw: bool = False, **kwargs: Any) -> None:
    if raw:
        return
    if created:
        data = {
            "scopes": [],
            "user_id": user_id(instance.owner_id),
            **_key_values({name: getattr(instance, name) for name in KEY_FIELDS}),
        }
        record(events.API_KEY_CREATED, api_key_id(instance.prefix), {"id": api_key_id(instance.prefix), "data": data})
        return
    changes = _changes(instance, KEY_FIELDS)
    if changes:
        details = {"id": api_key_id(instance.prefix), "changes_requested": _key_values(changes)}
        record(events.API_KEY_UPDATED, api_key_id(instance.prefix), details)


def _key_revoked(sender: type, api_key: APIKey, **kwargs: Any) -> None:
    record(events.API_KEY_DELETED, api_key_id(api_key.prefix), {"id": api_key_id(api_key.prefix)})


def _key_deleted(sender: type, instance: APIKey, **kwargs: Any) -> None:
    if instance.revoked_at is None:
        record(events.API_KEY_DELETED, api_key_id(instance.prefix), {"id": api_key_id(instance.prefix)})


# --- Users -------------------------------------------------------------------------------------


def role(is_staff: bool) -> str:
    """``owner`` for staff, ``reader`` for everyone else (the users API's roles)."""
    return "owner" if is_staff else "reader"


def _user_saved(sender: type, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    if raw:
        return
    public_id = user_id(instance.pk)
    if created:
        data = {"role": role(instance.is_staff), "username": instance.get_username(), "email": instance.email}
        record(events.USER_ADDED, public_id, {"id": public_id, "data": data})
        return
    changes = _changes(instance, USER_FIELDS)
    if "is_staff" in changes:
        changes["role"] = role(changes.pop("is_staff"))
    if "password" in changes:
        changes["password"] = "changed"
    if changes:
        record(events.USER_UPDATED, public_id, {"id": public_id, "changes_requested": changes})


def _user_deleted(sender: type, instance: Any, **kwargs: Any) -> None:
    record(events.USER_DELETED, user_id(instance.pk), {"id": user_id(instance.pk)})


# --- Sign-ins ----------------------------------------------------------------------------------


def _logged_in(sender: type, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    record(events.LOGIN_SUCCEEDED, user_id(user.pk), {}, actor=user_actor(user, client_ip(request)))


def mark_refused_by_lockout(request: HttpRequest) -> None:
    """Say that ``request``'s sign-in was refused by the lock-out, its password unchecked: the
    ``login.failed`` entry for it is the lock-out's (:func:`_locked_out`), not a wrong password."""
    setattr(request, _REFUSED_BY_LOCKOUT, True)


def _login_failed(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    if getattr(request, _REFUSED_BY_LOCKOUT, False):
        return
    username = credentials.get(get_user_model().USERNAME_FIELD)
    details = {"error_code": LOGIN_FAILED_CODE, "error_message": LOGIN_FAILED_MESSAGE, "username": username}
    _record_failed_sign_in(username, request, details)


def _locked_out(sender: Any, request: HttpRequest | None, username: str | None, **kwargs: Any) -> None:
    minutes = max(1, int(settings.AXES_COOLOFF_TIME.total_seconds()) // 60)
    message = f"Too many failed sign-ins with this username from this address: refused for {minutes} minutes."
    details = {"error_code": LOCKED_OUT_CODE, "error_message": message, "username": username}
    _record_failed_sign_in(username, request, details)


def _record_failed_sign_in(username: str | None, request: HttpRequest | None, details: dict[str, Any]) -> None:
    """A ``login.failed`` entry: by the account ``username`` names, else by an anonymous session."""
    user_model = get_user_model()
    user = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first() if username else None
    ip_address = client_ip(request)
    actor = actor_for(user, ip_address) if user is not None else Actor("session", ip_address=ip_address)
    record(events.LOGIN_FAILED, user_id(user.pk) if user is not None else "", details, actor=actor)
