"""The API's views: thin. Each parses, authenticates, calls the engine and picks JSON or SSE.

Routes (OpenAI's paths): ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /v1/models/{id}``, and ``GET /healthz``.  Every ``/v1`` route needs a Bearer key.  Every
generation request that gets past authentication leaves exactly one :class:`keys.models.UsageRecord`
(:class:`api.accounting.RequestUsage`), written in ``finally`` so that streamed, failed and
interrupted requests are counted with the tokens generated so far.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

from inference.outputs import EngineShuttingDown
from inference.registry import ServedModel
from keys import journal
from keys.db import database_health

from . import draining, sse
from .access import notes_of
from .accounting import RequestUsage
from .auth import authenticate, require_journal
from .chat.protocol import new_chat_completion_id, parse_chat_request
from .chat.serving import ChatRun
from .completions.protocol import new_completion_id, parse_completion_request
from .completions.serving import CompletionRun
from .engine import get_models, key_may_use
from .errors import APIError, error_response
from .generation import Generation, engine_error_code
from .handlers import is_api_path
from .protocol import body_too_large_error, model_list, model_not_found_error, model_object
from .types import Model

logger = logging.getLogger(__name__)


OWNED_BY = "completions-site"
INLINE_PARSE_BYTES = 16 * 1024  # bodies up to this size are parsed on the event loop


def api_view(*methods: str):
    """An API view: CSRF-exempt (keys, not cookies, authenticate it) and answering any other HTTP
    method with OpenAI's JSON error and a 405, not Django's empty HTML one.  A ``GET`` view answers
    ``HEAD`` too (RFC 9110: GET without the body; the server sends the headers only), and every
    view ``OPTIONS`` with an empty 200 naming the methods in ``Allow`` (a browser's preflight is
    answered before, by the CORS middleware: ``api/handlers.py``)."""
    if "GET" in methods:
        methods = (*methods, "HEAD")
    allow = ", ".join((*methods, "OPTIONS"))

    def decorate(view):
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if request.method == "OPTIONS":
                return HttpResponse(headers={"Allow": allow, "Content-Length": "0"})
            if request.method not in methods:
                response = error_response(
                    APIError(f"Invalid method for URL ({request.method} {request.path})", status=405)
                )
                response["Allow"] = allow
                return response
            return await view(request, *args, **kwargs)

        wrapper.__doc__, wrapper.__name__ = view.__doc__, view.__name__
        return csrf_exempt(wrapper)

    return decorate


@api_view("POST")
async def completions(request: HttpRequest) -> HttpResponseBase:
    """``POST /v1/completions`` (``CreateCompletionRequest`` → ``CreateCompletionResponse`` or SSE)."""
    return await _serve(request, COMPLETIONS)


@api_view("POST")
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    """``POST /v1/chat/completions`` (``CreateChatCompletionRequest`` → ``CreateChatCompletionResponse``
    or SSE of ``CreateChatCompletionStreamResponse``)."""
    return await _serve(request, CHAT_COMPLETIONS)


@dataclass(frozen=True)
class _Endpoint:
    """What differs between the two generation endpoints: path, id prefix, parser and run."""

    path: str
    new_id: Callable[[], str]
    parse: Callable[[bytes], Any]
    run: Callable[[Any, Any, str], Generation]  # (engine, parsed request, completion id)


COMPLETIONS = _Endpoint("/v1/completions", new_completion_id, parse_completion_request, CompletionRun)
CHAT_COMPLETIONS = _Endpoint("/v1/chat/completions", new_chat_completion_id, parse_chat_request, ChatRun)


async def _serve(request: HttpRequest, endpoint: _Endpoint) -> HttpResponseBase:
    """Authenticate, serve and account one generation request; one usage record whatever happens."""
    completion_id = endpoint.new_id()
    response: HttpResponseBase
    try:
        api_key = await authenticate(request)
        require_journal()  # a request whose usage could not be recorded is not served
    except APIError as error:
        response = error_response(error)
        response["x-request-id"] = completion_id
        return response
    # The access-log line reads the usage record from the request's notes; the notes do not hold
    # the RequestUsage itself, whose finalizer accounts for a stream dropped before its first byte.
    usage = RequestUsage(api_key, completion_id, endpoint.path, notes_of(request))
    try:
        response = await _start_completion(request, usage, endpoint)
    except APIError as error:
        await usage.finish(error.status, error_type=error.type)
        response = error_response(error)
    except BaseException as error:  # a disconnect (CancelledError) or a bug
        await usage.finish(_status_of(error), error_type=_type_of(error))
        raise
    response["x-request-id"] = completion_id
    # --- limits: OpenAI's x-ratelimit-* headers on every answer (keys/limits/, api/translate.py) ---
    for name, value in (await usage.rate_limit_headers()).items():
        response.setdefault(name, value)
    return response


async def _start_completion(request: HttpRequest, usage: RequestUsage, endpoint: _Endpoint) -> HttpResponseBase:
    """Validate, submit, and answer: JSON after generation, or a stream whose errors are in-band."""
    try:
        body = request.body
    except RequestDataTooBig:
        raise body_too_large_error(settings.API_MAX_BODY_BYTES) from None
    if len(body) > settings.API_MAX_BODY_BYTES:
        raise body_too_large_error(settings.API_MAX_BODY_BYTES)
    # A small body parses faster than a hop to a worker thread and back; a large one could stall the
    # event loop (docs/performance.md#the-engines-worker-thread).
    if len(body) <= INLINE_PARSE_BYTES:
        parsed = endpoint.parse(body)
    else:
        parsed = await asyncio.to_thread(endpoint.parse, body)
    usage.stream, usage.user = parsed.stream, parsed.user or ""
    served = get_models().resolve(parsed.model)
    if served is None or not key_may_use(usage.api_key, parsed.model, served):
        # The same 404 for a model the key may not use; the record keeps "" as its model, never
        # the client's text (a key pasted into "model" would be stored).
        raise model_not_found_error(parsed.model)
    engine = served.engine  # each model has its own engine: its queue, batch and KV cache
    usage.model = engine.model_id  # an alias is counted under the model that serves it
    if not engine.ready:
        raise APIError(
            "The model is loading; try again shortly.", status=503, type="server_error", headers={"Retry-After": "5"}
        )
    run = endpoint.run(engine, parsed, usage.request_id)
    usage.run = run
    await run.prepare()
    await usage.admit(run)  # limits: count and reserve tokens before the engine sees it, or 429
    run.start()
    usage.submitted = True  # from here on, tokens are charged
    if parsed.stream:
        response = StreamingHttpResponse(_stream(run, usage), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    try:
        result = await run.response()
    except BaseException as error:
        run.abort()
        await usage.finish(_status_of(error), error_type=_type_of(error))
        if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
            raise
        raise _as_api_error(error) from error
    await usage.finish(200)
    return JsonResponse(result)


async def _stream(run: Generation, usage: RequestUsage) -> AsyncIterator[bytes]:
    """The SSE body. A disconnect aborts the generation; the usage record is written either way."""
    error_type = ""
    usage.body_started = True  # Django sent the 200 before asking for the body
    try:
        async for chunk in sse.with_keepalive(_events(run), settings.API_SSE_KEEPALIVE_SECONDS):
            await usage.progress()  # the journal covers a chunk's tokens before the client has them
            yield chunk
    except (asyncio.CancelledError, GeneratorExit):
        error_type = "interrupted"
        raise
    except Exception as error:
        if isinstance(error, EngineShuttingDown):  # a planned shutdown's grace period ended: no fault
            logger.warning("Stream %s ended by the shutdown", run.id)
        else:
            logger.exception("Stream %s failed", run.id)
        api_error = _as_api_error(error)
        error_type = api_error.type  # the status stays 200: it was sent with the first byte
        yield sse.event(api_error.to_dict())
        yield sse.DONE
    finally:
        run.abort()
        # 200 whatever happened after the first byte: that is the status the client received.
        await usage.finish(200, error_type=error_type)


async def _events(run: Generation) -> AsyncIterator[bytes]:
    async for chunk in run.chunks():
        yield sse.event(chunk)
    yield sse.DONE


def _status_of(error: BaseException) -> int:
    if isinstance(error, APIError):
        return error.status
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return 499  # nginx's "client closed request"
    return getattr(error, "status", 500)


def _type_of(error: BaseException) -> str:
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return "interrupted"
    return error.type if isinstance(error, APIError) else "server_error"


def _as_api_error(error: BaseException) -> APIError:
    if isinstance(error, APIError):
        return error
    return APIError(
        str(error) or "The server had an error while processing your request.",
        status=_status_of(error),
        type="server_error",
        code=engine_error_code(error),  # a request the shutdown ended: server_shutting_down, as its refusals
    )


@api_view("GET")
async def models(request: HttpRequest) -> HttpResponse:
    """``GET /v1/models``: ``ListModelsResponse`` with every served model and its aliases, in the
    configured order (``MODELS_CONFIG``'s, or ``MODEL_ID`` then ``MODEL_ALIASES``), those the key may use."""
    try:
        api_key = await authenticate(request)
    except APIError as error:
        return error_response(error)
    return JsonResponse(
        model_list(
            _model(name, served)
            for served in get_models()
            for name in served.names
            if key_may_use(api_key, name, served)
        )
    )


@api_view("GET")
async def model_detail(request: HttpRequest, model: str) -> HttpResponse:
    """``GET /v1/models/{model}``: the ``Model`` object (a served model or an alias), or 404
    ``model_not_found``."""
    try:
        api_key = await authenticate(request)
    except APIError as error:
        return error_response(error)
    served = get_models().resolve(model)
    if served is None or not key_may_use(api_key, model, served):
        return error_response(model_not_found_error(model))
    return JsonResponse(_model(model, served))


def _model(name: str, served: ServedModel) -> Model:
    engine = served.engine
    return model_object(name, engine.created, OWNED_BY, getattr(engine.runner, "serving", None))


@csrf_exempt
async def not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    """Any other ``/v1`` URL: OpenAI's JSON 404 (``Invalid URL (METHOD /path)``)."""
    return error_response(APIError(f"Invalid URL ({request.method} {request.path})", status=404))


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler400``: a request Django refuses before any view (too many query fields, say) gets
    OpenAI's JSON 400 on the API's paths and Django's page elsewhere.  (With ``DEBUG`` on, Django
    shows its technical page instead.)"""
    if is_api_path(request.path_info):
        return error_response(APIError(str(exception) or "Bad request.", status=400))
    return defaults.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: OpenAI's JSON 500 on the API's paths, Django's page elsewhere."""
    if is_api_path(request.path_info):
        response = error_response(
            APIError("The server had an error while processing your request.", status=500, type="server_error")
        )
        # Unlike an APIError's answer, this one has not been logged: Django logs the exception (with
        # its traceback) after this handler returns, unless the response says it already was.
        response._has_been_logged = False  # type: ignore[attr-defined]
        return response
    return defaults.server_error(request)


async def healthz(request: HttpRequest) -> HttpResponse:
    """``GET /healthz``: 200 once every model is loaded, 503 while one loads (or if loading failed),
    while the process drains after SIGTERM (``"status": "draining"``), while the database does
    not answer (``"database": "unreachable"``, as the process's last query or probe found it:
    ``keys/db.py``) and while the usage journal cannot be written (``"usage_journal":
    "unwritable"``, until its probe write succeeds: ``keys/journal.py``).

    ``models`` lists each model's own state and figures; the running and waiting requests and tokens
    per second at the top are their sums.  Where one model is served, its ``model`` id, ``runner``,
    ``weights`` and ``error`` are at the top too (as the body was before there could be several)."""
    states = [_model_health(served) for served in get_models()]
    reachable, journaling = database_health.reachable, journal.accepting()
    ready = all(state["status"] == "ok" for state in states)
    failed = any(state["status"] == "error" for state in states)
    body: dict[str, Any] = {"status": "error" if failed else "ok" if ready else "loading"}
    if len(states) == 1:
        body["model"] = states[0]["id"]
    body["running"] = sum(state["running"] for state in states)
    body["waiting"] = sum(state["waiting"] for state in states)
    body["tokens_per_second"] = round(sum(state["tokens_per_second"] for state in states), 1)
    body["database"] = "ok" if reachable else "unreachable"
    body["usage_journal"] = "ok" if journaling else "unwritable"
    if len(states) == 1:
        body.update({key: states[0][key] for key in ("runner", "weights", "error") if key in states[0]})
    body["models"] = states
    if draining.state.draining:
        body["status"] = "draining"
        body["open_requests"] = draining.state.open_requests
    healthy = ready and not draining.state.draining and reachable and journaling
    if ready and not (reachable and journaling) and body["status"] == "ok":
        body["status"] = "unavailable"
    response = JsonResponse(body, status=200 if healthy else 503)
    # A 503 while loading is expected: Django's private flag keeps it out of the error log.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _model_health(served: ServedModel) -> dict[str, Any]:
    """One model's state (``ok``, ``loading`` or ``error`` with its reason) and live figures."""
    engine = served.engine
    state: dict[str, Any] = {"id": served.id, "status": "ok" if engine.ready else "loading", **engine.stats()}
    if engine.ready and engine.runner is not None:  # what serves: the forward pass and weight formats
        state["runner"] = engine.runner.description
        state["weights"] = engine.runner.weight_formats
    if engine.load_error is not None:
        state["status"] = "error"
        state["error"] = f"{type(engine.load_error).__name__}: {engine.load_error}"
    return state
