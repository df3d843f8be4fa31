"""Public ids of users, API keys, admin keys and rate limits: one scheme for every surface.

The Administration API (``organization/``), the usage APIs (``api_key_id``, ``user_id``) and the
audit log (actor and resource ids) all name things through here, so an id read in one is found
in the others:

- a user: ``user_{pk}``.  OpenAI's spec writes users' ids ``user_abc`` in the Administration API's
  own examples (``/organization/users/user_abc``, ``UserListResponse``, project users, role
  assignments); ``user-...`` appears only in an audit-log actor example and two ``first_id``s.
- an API key or an admin key: ``key_{prefix}`` (OpenAI's ``key_abc``), the key's public prefix, so an
  id never reveals the secret.  The two kinds share the form; their prefixes are random.
- a key's rate limit: ``rl_{prefix}`` for its limits over all models, ``rl_{prefix}:{model}`` for its
  own requests and tokens per minute for one model (OpenAI's ``rl_...`` are per model).
"""

from __future__ import annotations

USER_ID_PREFIX = "user_"
API_KEY_ID_PREFIX = "key_"
RATE_LIMIT_ID_PREFIX = "rl_"
_MAX_PK_DIGITS = 18


def user_id(pk: int) -> str:
    """``"user_12"`` for the user whose primary key is 12."""
    return f"{USER_ID_PREFIX}{pk}"


def parse_user_id(public_id: str) -> int | None:
    """The primary key that ``"user_12"`` names, or ``None`` when ``public_id`` is not such an id."""
    digits = public_id.removeprefix(USER_ID_PREFIX)
    if digits == public_id or not digits.isascii() or not digits.isdigit() or len(digits) > _MAX_PK_DIGITS:
        return None
    return int(digits)


def api_key_id(prefix: str) -> str:
    """``"key_AbCd1234"`` for the key (API or admin) whose public prefix is ``AbCd1234``."""
    return f"{API_KEY_ID_PREFIX}{prefix}"


def parse_api_key_id(public_id: str) -> str:
    """The prefix that ``"key_AbCd1234"`` names (a bare prefix is taken as it is: the usage API's filter)."""
    return public_id.removeprefix(API_KEY_ID_PREFIX)


def key_prefix(public_id: str) -> str | None:
    """The prefix that ``"key_AbCd1234"`` names, or ``None`` when ``public_id`` is not such an id
    (nor when it holds a NUL character, which no prefix has and PostgreSQL refuses in a query)."""
    prefix = public_id.removeprefix(API_KEY_ID_PREFIX)
    return prefix if prefix != public_id and "\x00" not in prefix else None


def rate_limit_id(prefix: str, model: str = "") -> str:
    """``"rl_AbCd1234"``: the rate limit of the key whose public prefix is ``AbCd1234``;
    ``"rl_AbCd1234:big"``: its own for the model ``big``."""
    return f"{RATE_LIMIT_ID_PREFIX}{prefix}:{model}" if model else f"{RATE_LIMIT_ID_PREFIX}{prefix}"


def parse_rate_limit_id(public_id: str) -> tuple[str, str] | None:
    """``(prefix, model)`` that ``"rl_AbCd1234:big"`` names (``model`` ``""`` for ``"rl_AbCd1234"``),
    or ``None`` when ``public_id`` is not such an id (nor when it holds a NUL character).  A prefix
    holds no colon, so the model id may."""
    rest = public_id.removeprefix(RATE_LIMIT_ID_PREFIX)
    if rest == public_id or "\x00" in rest:
        return None
    prefix, colon, model = rest.partition(":")
    if colon and not model:
        return None
    return prefix, model


def rate_limit_prefix(public_id: str) -> str | None:
    """The key prefix that ``"rl_AbCd1234"`` or ``"rl_AbCd1234:big"`` names, or ``None`` when
    ``public_id`` is not such an id (nor when it holds a NUL character)."""
    parsed = parse_rate_limit_id(public_id)
    return parsed[0] if parsed else None
