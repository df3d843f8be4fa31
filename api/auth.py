"""Authentication and admission as the views need them: the domain's calls, its errors as HTTP.

``keys.auth`` and ``keys.limits`` raise the domain's errors; these wrappers raise the
:class:`~api.errors.APIError` each becomes (``api/translate.py``), which the views answer with.
"""

from __future__ import annotations

from django.http import HttpRequest

from keys import auth, journal, limits
from keys.errors import AuthFailed, DatabaseUnavailable, LimiterUnavailable, LimitRefused
from keys.models import APIKey

from . import metrics
from .access import note
from .translate import auth_error, database_error, journal_error, limit_error, limiter_error, rate_limit_headers


async def authenticate(request: HttpRequest) -> APIKey:
    """The active key of the request's ``Authorization: Bearer`` header (one query).

    Raises ``APIError`` 401 (OpenAI's ``invalid_api_key``, or ``code: null`` when no key is sent),
    or 503 ``database_unavailable`` with ``Retry-After`` when the database does not answer.
    The key's public prefix and owner go to the request's access-log line (:mod:`api.access`).
    """
    try:
        api_key = await auth.authenticate(request.headers.get("Authorization"))
    except AuthFailed as error:
        raise auth_error(error) from None
    except DatabaseUnavailable as error:
        metrics.unavailable.labels(cause="database").inc()
        raise database_error(error) from None
    note(request, key_prefix=api_key.prefix, owner=api_key.owner.get_username())
    return api_key


async def admit(api_key: APIKey, request_id: str, tokens: int, cost: int = 0, model: str = "") -> limits.Admission:
    """:func:`keys.limits.admit` (``model``: the served model's id), refusals as HTTP: ``LimitExceeded``
    (429, with OpenAI's headers) or ``APIError`` 503 when the limits cannot be checked (Redis, or the
    database for a quota)."""
    try:
        return await limits.admit(api_key, request_id, tokens, cost, model)
    except LimitRefused as refused:
        raise limit_error(refused) from None
    except LimiterUnavailable as error:
        raise limiter_error(error) from None
    except DatabaseUnavailable as error:
        metrics.unavailable.labels(cause="database").inc()
        raise database_error(error) from None


def require_journal() -> None:
    """Raise ``APIError`` 503 ``usage_journal_unavailable`` (with ``Retry-After``) while the usage
    journal cannot be written: a request whose usage cannot be recorded is not served."""
    if not journal.accepting():
        metrics.unavailable.labels(cause="journal").inc()
        raise journal_error()


def admission_headers(admission: limits.Admission) -> dict[str, str]:
    """The ``x-ratelimit-*`` headers of an admitted request, as of its admission."""
    return rate_limit_headers(admission.scopes, admission.decision)


async def current_headers(api_key: APIKey, model: str = "") -> dict[str, str]:
    """The key's (its user's, and its for ``model``) ``x-ratelimit-*`` headers without counting
    anything (responses refused early)."""
    state = await limits.peek(api_key, model)
    return {} if state is None else rate_limit_headers(*state)
