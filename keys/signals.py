"""Signals the keys app sends for events that Django's model signals do not see.

``api_key_revoked`` is sent by :meth:`keys.models.APIKey.revoke` once, when it revokes a key
(revocation is a conditional UPDATE, which sends no ``post_save``).  Arguments: ``sender`` (the
``APIKey`` class) and ``api_key`` (the row, its ``revoked_at`` set).  The audit app records it.
"""

from __future__ import annotations

from django.dispatch import Signal

api_key_revoked = Signal()
