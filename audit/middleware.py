"""``AuditActorMiddleware``: each request's actor for the audit log (see ``audit.context``).

Put it after ``AuthenticationMiddleware``.  It runs in sync and async stacks alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from .context import acting_for_request


class AuditActorMiddleware:
    """Sets the request's actor for the events recorded while the view runs."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        if self.is_async:
            return self._acall(request)
        with acting_for_request(request):
            return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        with acting_for_request(request):
            return await self.get_response(request)
