"""The ASGI handler of the API's paths: Django's, without the browser middleware.

Every middleware in ``MIDDLEWARE`` is a ``MiddlewareMixin``, whose async ``__acall__`` runs its
``process_request`` and ``process_response`` in a worker thread (``sync_to_async``): with the seven
that the admin and the dashboard need (sessions, CSRF, auth, messages, ...), an API call would
make about a dozen hops to a thread and back that do nothing for it (keys authenticate it, not
cookies).  :class:`APIHandler` serves ``/v1/...`` and ``/healthz`` with none of them;
:func:`route` sends every other path to the full handler.
"""
from __future__ import annotations

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

API_PATH_PREFIXES = ("/v1/", "/healthz")


class APIHandler(ASGIHandler):
    """``ASGIHandler`` with an empty middleware chain (what ``MIDDLEWARE = []`` would build).

    The views still get Django's request, URL routing, exception handling and the request
    signals (which close stale database connections).  Responses gain
    ``X-Content-Type-Options: nosniff``, the one header of ``SecurityMiddleware`` that an API
    answer needs.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware, self._template_response_middleware, self._exception_middleware = [], [], []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)

    async def get_response_async(self, request):
        response = await super().get_response_async(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response


def is_api_path(path: str) -> bool:
    """Whether an HTTP path is served by :class:`APIHandler` (``/v1``, ``/v1/...``, ``/healthz``)."""
    return path == "/v1" or path.startswith(API_PATH_PREFIXES)


def route(api_application, site_application):
    """An ASGI app sending HTTP requests for API paths to ``api_application``, the rest to ``site_application``."""

    async def application(scope, receive, send):
        if scope["type"] == "http" and is_api_path(scope["path"]):
            return await api_application(scope, receive, send)
        return await site_application(scope, receive, send)

    return application
