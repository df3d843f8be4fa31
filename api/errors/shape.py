"""OpenAI's error shape: one exception type and one response helper for the whole API.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}`` with all four
keys present (the spec's ``Error`` schema in ``openai-openapi.yaml`` requires them all).
"""

from __future__ import annotations

from django.http import JsonResponse


class APIError(Exception):
    """An error that becomes an HTTP response (or an in-band SSE error event after the first byte).

    ``status`` is the HTTP status; ``type``, ``param`` and ``code`` are OpenAI's fields, e.g.
    ``APIError("Invalid 'n': ...", param="n", code="integer_above_max_value")`` (the builders of
    :mod:`api.errors.schema` make these).
    ``headers`` are extra response headers such as ``Retry-After``.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_response(error: APIError) -> JsonResponse:
    """The JSON HTTP response for ``error``, with its status and extra headers.

    Django's ``django.request`` logger does not log it a second time: the access log
    (``api/access.py``) has one line for every request, its status included.  (Django's private
    flag; an uncaught exception's 500 is still logged with its traceback.)
    """
    response = JsonResponse(error.to_dict(), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    response._has_been_logged = True  # type: ignore[attr-defined]  # Django's private flag: not logged again
    return response
