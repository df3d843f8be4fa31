"""The ASGI handler of the API's paths: Django's, without the browser middleware.

Every middleware in ``MIDDLEWARE`` is a ``MiddlewareMixin``, whose async ``__acall__`` runs its
``process_request`` and ``process_response`` in a worker thread (``sync_to_async``): with the seven
that the admin and the dashboard need (sessions, CSRF, auth, messages, ...), an API call would
make about a dozen hops to a thread and back that do nothing for it (keys authenticate it, not
cookies).  :class:`APIHandler` serves ``/v1/...`` and ``/healthz`` with none of them but
django-cors-headers' (an async one), for browsers calling the API; :func:`route` sends every
other path to the full handler.

Django's ``ASGIHandler`` also starts a thread for every request (its ``ThreadSensitiveContext``
makes a one-thread executor per request for the request's synchronous calls: signals, queries)
and joins it at the end; at the API's request rates that cost a quarter of the event loop's time.
:class:`LanedHandler` (the site's handler; :class:`APIHandler` is one too) runs each request's
synchronous calls on one of :data:`DATABASE_LANES` long-lived threads instead, the one with the
fewest requests on it (asgiref's ``ThreadSensitiveContext(executor=...)``): a request's calls still
share one thread, as Django expects, and its database connection outlives the request (SQLite's
persist: ``CONN_MAX_AGE``).  A request stuck in a query holds up only the requests on its lane.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from asgiref.sync import ThreadSensitiveContext
from corsheaders.middleware import CorsMiddleware
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from api import draining, metrics
from api.errors import APIError, error_response
from audit.context import acting_for_request
from keys.db import DATABASE_DOWN, database_health
from keys.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)
security_logger = logging.getLogger("django.security.DisallowedHost")

# Threads for the requests' synchronous calls: requests on one thread wait for each other's calls
# (each a query or two, about a millisecond), so a few suffice for 2 cores; a PostgreSQL pool
# (DATABASE_POOL_MAX_SIZE, 10 by default) serves them all at once.
DATABASE_LANES = 8


class Lanes:
    """:data:`DATABASE_LANES` one-thread executors; a request takes the one with the fewest requests
    in flight on it (the event loop's thread alone counts them)."""

    def __init__(self, count: int = DATABASE_LANES) -> None:
        self._executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lane-{i}") for i in range(count)]
        self._requests = [0] * count

    @contextlib.asynccontextmanager
    async def context(self) -> AsyncIterator[None]:
        """The thread-sensitive context of one request, on the least busy lane."""
        index = min(range(len(self._requests)), key=self._requests.__getitem__)
        self._requests[index] += 1
        try:
            async with ThreadSensitiveContext(executor=self._executors[index]):
                yield
        finally:
            self._requests[index] -= 1


LANES = Lanes()  # the process's, shared by the API's handler and the site's


class LanedHandler(ASGIHandler):
    """``ASGIHandler`` whose requests' synchronous calls run on :data:`LANES` (see the module docstring)."""

    async def __call__(self, scope, receive, send) -> None:
        """Serve one HTTP request as ``ASGIHandler`` does, its synchronous calls on a lane's thread."""
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        async with LANES.context():
            await self.handle(scope, receive, send)


class APIHandler(LanedHandler):
    """``ASGIHandler`` with an empty middleware chain (what ``MIDDLEWARE = []`` would build).

    The views still get Django's request, URL routing, exception handling and the request
    signals (which close stale database connections); a database that does not answer is a 503
    (:meth:`_view_response`).  Of the middleware's work the API keeps
    two parts: the ``Host`` header must be in ``ALLOWED_HOSTS`` (``CommonMiddleware`` checked it;
    here a refusal is OpenAI's JSON 400), and responses carry ``X-Content-Type-Options: nosniff``
    (``SecurityMiddleware``).  And the audit log's actor is the request's, as
    ``audit.middleware.AuditActorMiddleware`` sets it on the other paths (an Administration API
    view's ``request.auth`` or ``request.audit_actor``; see ``audit.context``).

    One middleware runs: django-cors-headers' ``CorsMiddleware`` (``API_CORS_ALLOWED_ORIGINS``),
    around every answer after the ``Host`` check, a draining 503 included, so that a browser
    reads the API's errors too; it answers a preflight (``OPTIONS`` with
    ``Access-Control-Request-Method``) itself.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        # BaseHandler._get_response_async is the innermost step every middleware chain wraps;
        # django-stubs does not declare this private method.
        self._middleware_chain = convert_exception_to_response(self._view_response)
        self._cors = CorsMiddleware(self._admitted_response)  # async, as its inner callable is

    async def _view_response(self, request: HttpRequest) -> HttpResponseBase:
        """The view's response; a database that does not answer is a 503 with ``Retry-After`` (for
        any API view: authentication says so itself), not a 500."""
        try:
            return await self._get_response_async(request)  # type: ignore[attr-defined]
        except DATABASE_DOWN as error:
            from api.translate import database_error  # imports the models: not before django.setup() (asgi.py)

            database_health.failed(error)
            logger.warning("%s %s: 503, the database does not answer (%s)", request.method, request.path, error)
            metrics.unavailable.labels(cause="database").inc()
            return error_response(database_error(DatabaseUnavailable(error)))

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase
        try:
            request.get_host()
        except DisallowedHost as error:
            security_logger.warning("%s", error)
            response = error_response(APIError("Invalid Host header.", status=400))
        else:
            with acting_for_request(request):
                response = await cast(Awaitable[HttpResponseBase], self._cors(request))
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

    async def _admitted_response(self, request: HttpRequest) -> HttpResponseBase:
        """The view's response, or a 503 with ``Retry-After`` once the process drains (SIGTERM:
        ``api/draining.py``); ``/healthz`` still answers, with ``draining``."""
        if draining.state.draining and request.path_info != "/healthz":
            metrics.draining_refused.inc()
            return error_response(draining.refusal_error())
        return await super().get_response_async(request)


def is_api_path(path_info: str) -> bool:
    """Whether a request's path, below the script prefix, is the API's (``/v1/...``, ``/healthz``)."""
    return path_info.startswith("/v1/") or path_info == "/healthz"


def route(api_application, site_application):
    """An ASGI app sending HTTP requests for API paths to ``api_application``, the rest to ``site_application``.

    It decides on the path Django routes on: the request's path without its script prefix
    (``root_path``, which a proxy may set with daphne's ``Daphne-Root-Path`` header), so that no
    path reaches a non-API view through the API's handler.
    """

    async def application(scope, receive, send):
        if scope["type"] == "http" and is_api_path(scope["path"].removeprefix(get_script_prefix(scope))):
            return await api_application(scope, receive, send)
        return await site_application(scope, receive, send)

    return application
