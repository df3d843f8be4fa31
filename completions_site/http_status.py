"""Reason phrases for the statuses twisted's table lacks (429 among them).

daphne answers with ``request.setResponseCode(status)`` and no phrase, so twisted looks the status
up in ``twisted.web.http.RESPONSES``; a status missing there goes out as ``HTTP/1.1 429 Unknown
Status``.  Clients read the code, not the phrase, but logs, proxies and people read the phrase.
:func:`add_reason_phrases` fills the table's gaps from the standard library's
:class:`http.HTTPStatus` (RFC 9110 and friends) without changing a phrase twisted already has.
"""

from __future__ import annotations

from http import HTTPStatus


def add_reason_phrases() -> list[int]:
    """Add the missing statuses to twisted's table; returns the statuses added."""
    from twisted.web import http

    added = [status.value for status in HTTPStatus if status.value not in http.RESPONSES]
    for code in added:
        http.RESPONSES[code] = HTTPStatus(code).phrase.encode("ascii")
    return added
