"""daphne (twisted) answers each status with its reason phrase, 429's included."""

from __future__ import annotations


def test_twisted_knows_the_phrase_of_429_after_add_reason_phrases():
    from twisted.web import http

    from completions_site.http_status import add_reason_phrases

    add_reason_phrases()
    assert http.RESPONSES[429] == b"Too Many Requests"
    assert http.RESPONSES[404] == b"Not Found"  # twisted's own phrases stay
