"""Public ids of users and API keys, as the Administration API, the usage API and the audit log show them.

OpenAI names a user ``user-abc`` and an API key by an id of its own; ours are ``user-{pk}`` and
``key_{prefix}`` (the key's public prefix, so an id never reveals the secret and is the same
wherever it appears).  Every module that prints or parses these ids goes through here.
"""

from __future__ import annotations

USER_ID_PREFIX = "user-"
API_KEY_ID_PREFIX = "key_"


def user_id(pk: int) -> str:
    """``"user-12"`` for the user whose primary key is 12."""
    return f"{USER_ID_PREFIX}{pk}"


def parse_user_id(public_id: str) -> int | None:
    """The primary key that ``"user-12"`` names, or ``None`` when ``public_id`` is not such an id."""
    digits = public_id.removeprefix(USER_ID_PREFIX)
    if digits == public_id or not digits.isdigit() or len(digits) > 18:
        return None
    return int(digits)


def api_key_id(prefix: str) -> str:
    """``"key_AbCd1234"`` for the key whose public prefix is ``AbCd1234``."""
    return f"{API_KEY_ID_PREFIX}{prefix}"


def parse_api_key_id(public_id: str) -> str:
    """The prefix that ``"key_AbCd1234"`` names (a bare prefix is taken as it is)."""
    return public_id.removeprefix(API_KEY_ID_PREFIX)
