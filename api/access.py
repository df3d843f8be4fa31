"""One access-log line and one metrics count per HTTP request, and the ``x-request-id`` it is known by.

:class:`AccessLog` wraps the HTTP application (``completions_site/asgi.py``).  When a response has
been sent it logs one line on the logger ``completions.access`` with the request id, method, path
(never the query string), status, latency and, for the API, what the views noted on the request
(:func:`note`): the key's public prefix (the 8 characters after ``sk-cs-``, never its secret),
the key's owner, and for a generation
the model, the request's ``user`` field, tokens and time to first token, as its usage record has
them.  ``/healthz`` and ``/metrics`` (polled every few seconds) log at DEBUG unless they answer a
5xx.  With ``LOG_FORMAT=json`` each field is a key of the JSON line (``completions_site/logs.py``).

The request id: an incoming ``X-Request-ID`` that is well formed (1 to 128 characters of
``[A-Za-z0-9._-]``, what a proxy's or client's generated id looks like) is echoed in the
response's ``x-request-id``; otherwise the response keeps the one the view set (a completion's
id, as OpenAI's ``x-request-id`` names the request) or gets a new ``req_...``.  A malformed one is
ignored, so nothing a client sends reaches the log or a header unchecked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from typing import Any

from . import draining, metrics

logger = logging.getLogger("completions.access")

REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
# A load balancer's and Prometheus's polls: at DEBUG, unless the answer is a 5xx.
QUIET_PATHS = frozenset({"/healthz", "/metrics"})
SCOPE_KEY = "completions.access"  # where views leave their notes in the ASGI scope
# The fields of a line, in order; those a request lacks are left out.
FIELDS = (
    "request_id",
    "completion_id",
    "method",
    "path",
    "status",
    "key_prefix",
    "owner",
    "user",
    "model",
    "endpoint",
    "stream",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "error_type",
    "latency_ms",
    "ttft_ms",
)


def well_formed_request_id(value: str | None) -> bool:
    """Whether ``value`` may be echoed as ``x-request-id``: 1-128 characters of ``[A-Za-z0-9._-]``."""
    return value is not None and REQUEST_ID.fullmatch(value) is not None


def note(request: Any, **fields: Any) -> None:
    """Add ``fields`` to the access-log line of ``request`` (an ASGI request; others are ignored)."""
    notes_of(request).update(fields)


def notes_of(request: Any) -> dict[str, Any]:
    """The dict of ``request``'s access-log fields (a throwaway one for a non-ASGI request).

    Hold plain data in it, not objects with finalizers: the ASGI scope outlives the view.
    """
    scope = getattr(request, "scope", None)
    return scope.setdefault(SCOPE_KEY, {}) if isinstance(scope, dict) else {}


class AccessLog:
    """ASGI middleware: the request id, one access-log line and the gateway's request metrics."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.monotonic()
        incoming = _header(scope, b"x-request-id")
        sent: dict[str, Any] = {"status": 0, "request_id": incoming if well_formed_request_id(incoming) else None}

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = _with_request_id(message, sent)
            await send(message)

        unanswered = 499  # the status counted if no answer started: the client left...
        # An API request (not /healthz, /metrics or the site) keeps a draining process alive until
        # its response's last byte, a non-streamed JSON answer included.
        served = draining.state.serving() if _drained(scope["path"]) else contextlib.nullcontext()
        try:
            with served:
                await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            raise
        except BaseException:
            unanswered = 500  # ...unless the application failed before answering
            raise
        finally:
            seconds = time.monotonic() - started
            status = sent["status"] or unanswered
            metrics.count_request(scope["path"], status, seconds)
            _log(scope, sent["request_id"], status, seconds)


def _drained(path: str) -> bool:
    """Whether a draining process waits for a request to this path (the API's, but ``/healthz``)."""
    return path.startswith("/v1/")


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _with_request_id(message: dict, sent: dict[str, Any]) -> dict:
    """The response start ``message`` with ``x-request-id`` set: the incoming id, the view's, or a new one."""
    headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"x-request-id"]
    own = next((v.decode("latin-1") for k, v in message.get("headers", ()) if k.lower() == b"x-request-id"), None)
    request_id = sent["request_id"] or own or f"req_{uuid.uuid4().hex}"
    sent["request_id"], sent["status"] = request_id, message["status"]
    headers.append((b"x-request-id", request_id.encode("latin-1")))
    return {**message, "headers": headers}


def _log(scope: dict, request_id: str | None, status: int, seconds: float) -> None:
    notes = scope.get(SCOPE_KEY, {})
    fields: dict[str, Any] = {
        "request_id": request_id,
        "method": scope.get("method"),
        "path": scope["path"],
        "status": status,
        "latency_ms": round(seconds * 1000, 1),
    }
    usage = notes.get("usage_record")  # a generation's usage record, as written (api/accounting.py)
    if usage:
        fields.update(
            completion_id=usage["request_id"] if usage["request_id"] != request_id else None,
            user=usage["user"] or None,
            model=usage["model"],
            endpoint=usage["endpoint"],
            stream=usage["stream"],
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            finish_reason=usage["finish_reason"] or None,
            error_type=usage["error_type"] or None,
            ttft_ms=None if usage["time_to_first_token_ms"] is None else round(usage["time_to_first_token_ms"], 1),
        )
    fields.update({k: v for k, v in notes.items() if k != "usage"})
    line = {name: fields[name] for name in FIELDS if fields.get(name) is not None}
    level = logging.DEBUG if scope["path"] in QUIET_PATHS and status < 500 else logging.INFO
    logger.log(level, "%s %s %s", line.get("method"), line["path"], status, extra={"access": line})
