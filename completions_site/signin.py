"""Sign-in lock-out, by django-axes, on every login form (the admin's and ``/account/login/``).

After ``SIGNIN_FAILURE_LIMIT`` failed sign-ins with one username from one address, that pair is
refused for ``SIGNIN_LOCKOUT_MINUTES`` without its password being checked: a 429 page with
``Retry-After``.  Axes counts the failures in its own table (``AccessAttempt``, in the admin,
where staff can delete a lock; or ``manage.py axes_reset``); the audit log records the failures
and the lock-out (``audit.receivers``).
"""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.exceptions import AxesBackendPermissionDenied
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from audit.receivers import mark_refused_by_lockout

LOCKED_OUT_TEMPLATE = "account/locked_out.html"


class LockoutBackend(AxesStandaloneBackend):
    """Axes' backend, first in ``AUTHENTICATION_BACKENDS``: it refuses a locked-out sign-in and
    authenticates nobody itself (``ModelBackend``, next, checks the password)."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        """Nothing for a sign-in that no HTTP request makes (a test client's ``login``, a script:
        no address to count it against); raises ``PermissionDenied`` for a locked-out pair."""
        if request is None:
            return None
        try:
            return super().authenticate(request, username, password, **kwargs)
        except AxesBackendPermissionDenied:
            mark_refused_by_lockout(request)
            raise


def lockout_response(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """The locked-out page: 429 with ``Retry-After`` (axes' ``AXES_LOCKOUT_CALLABLE``)."""
    seconds = int(settings.AXES_COOLOFF_TIME.total_seconds())
    response = TemplateResponse(
        request,
        LOCKED_OUT_TEMPLATE,
        {"minutes": max(1, seconds // 60), "failure_limit": settings.AXES_FAILURE_LIMIT},
        status=429,
    )
    response["Retry-After"] = str(seconds)
    return response.render()
