"""The domain's own errors: what keys, auth and limits refuse, without a word of HTTP.

The API (``api/``) translates each into OpenAI's error shape and status (``api/translate.py``);
nothing under ``keys/`` builds a response.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .limits.decision import Decision, Limits, Scope


class AuthFailed(Exception):
    """A request did not authenticate.

    ``missing`` is true when no credential was presented (no ``Authorization`` header, an empty
    token, a scheme other than Bearer), false for every key that does not authenticate (unknown,
    malformed, revoked, expired, wrong secret, deactivated owner: one error, so a caller learns
    nothing about which keys exist).  ``reason`` is for the operators' log only.
    """

    def __init__(self, *, missing: bool, reason: str = "") -> None:
        super().__init__(reason or ("no credential" if missing else "incorrect key"))
        self.missing = missing
        self.reason = reason


class LimitRefused(Exception):
    """A limit, quota or budget of the key, of its user or of the key for the request's model
    refused a request that would cost up to ``tokens`` tokens and ``cost`` nanos.

    ``decision`` is the counter store's answer (its ``refusal`` names the limit: ``quota``,
    ``budget``, ``too_large``, ``concurrency``, ``requests`` or ``tokens``), ``scopes`` the request's
    scopes (the key's, the user's, the key's for the model) and :attr:`scope` the one that refused
    (``scope.kind`` is ``"key"``, ``"user"`` or ``"model"`` with its ``model``, ``scope.limits`` its
    limits in force, its ``month`` and ``budget_window`` the periods).  Nothing was counted or reserved.
    """

    def __init__(self, decision: Decision, scopes: Sequence[Scope], tokens: int, cost: int = 0) -> None:
        super().__init__(f"refused by the {scopes[decision.refused_by].kind}'s {decision.refusal}")
        self.decision = decision
        self.scopes = tuple(scopes)
        self.tokens = tokens
        self.cost = cost

    @property
    def scope(self) -> Scope:
        return self.scopes[self.decision.refused_by]

    @property
    def limits(self) -> Limits:
        return self.scope.limits


class LimiterUnavailable(Exception):
    """The limits could not be checked, so the request is refused.

    ``closed`` is true when Redis is unreachable and ``API_LIMITS_FAIL_MODE`` is ``closed``;
    false when the counters could not be read after seeding (a race that a retry resolves).
    ``retry_after_seconds`` is how long to wait before trying again.
    """

    def __init__(self, *, closed: bool, retry_after_seconds: int) -> None:
        super().__init__("limiter unavailable" if closed else "limiter could not count")
        self.closed = closed
        self.retry_after_seconds = retry_after_seconds


class DatabaseUnavailable(Exception):
    """The database did not answer (down, restarting, no pooled connection to give in time).

    Nothing was decided about the request: it may be retried after ``retry_after_seconds``.
    """

    def __init__(self, error: BaseException, retry_after_seconds: int = 5) -> None:
        super().__init__(f"database unavailable: {type(error).__name__}: {error}")
        self.retry_after_seconds = retry_after_seconds


class JournalUnavailable(Exception):
    """The usage journal cannot be written (a full disk, a read-only folder): see :mod:`keys.journal`."""


class TooManyKeys(Exception):
    """A user already holds ``cap`` active API keys, their most (``API_USER_MAX_KEYS`` or their own)."""

    def __init__(self, cap: int) -> None:
        super().__init__(
            f"This user already has {cap} active API keys, the most allowed; revoke one before creating another."
        )
        self.cap = cap
