"""The organization's members: the rule that it always keeps an active owner.

An owner is an active staff user, and an admin key works only while its owner is one
(``authentication``), so an organization left without any could not call this API again: every
admin key would be a 401.  Two owners demoting each other at once would each see the other still
an owner; :func:`change_member` takes a row lock on the active owners (``select_for_update``,
inside ``transaction.atomic``; on SQLite, whose ``transaction_mode`` is ``IMMEDIATE`` here, the
atomic block alone serialises writers), so the second change sees the first and is refused.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction


class LastOwnerError(Exception):
    """The change would leave the organization without an active owner."""


def change_member(user: Any, *, is_staff: bool | None = None, is_active: bool | None = None) -> None:
    """Set ``user``'s ``is_staff`` and/or ``is_active``; :class:`LastOwnerError` (nothing saved) when
    it would take away the last active owner."""
    changes = {name: value for name, value in (("is_staff", is_staff), ("is_active", is_active)) if value is not None}
    with transaction.atomic():
        owners = set(
            get_user_model()
            .objects.select_for_update()
            .filter(is_active=True, is_staff=True)
            .values_list("pk", flat=True)
        )
        stays_owner = changes.get("is_staff", True) and changes.get("is_active", True)
        if user.pk in owners and not stays_owner and not owners - {user.pk}:
            raise LastOwnerError
        for name, value in changes.items():
            setattr(user, name, value)
        user.save(update_fields=list(changes))
