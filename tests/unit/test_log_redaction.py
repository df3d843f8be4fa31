"""Secrets never reach a log line or a usage record; access lines as plain text or JSON."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from completions_site.logs import JsonFormatter, PlainFormatter, RedactSecrets
from keys.redaction import redact

KEY = "sk-cs-AbCd1234.Zm9vYmFyYmF6cXV4LXNlY3JldC10b2tlbi0wMTIzNDU2Nzg5"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f'"GET /v1/completions?api_key={KEY} HTTP/1.1" 401', '"GET /v1/completions?api_key=*** HTTP/1.1" 401'),
        ("/v1/models?key=abc&limit=3&token=xyz", "/v1/models?key=***&limit=3&token=***"),
        ("/x?API_KEY=abc;access_token=def", "/x?API_KEY=***;access_token=***"),
        (f"Bearer {KEY}", "Bearer sk-cs-AbCd1234.***"),
        ("user pasted sk-cs-not-a-real-key here", "user pasted sk-cs-*** here"),
        ("monkey=1&turkey=2&keyboard=3", "monkey=1&turkey=2&keyboard=3"),
        ("nothing to hide", "nothing to hide"),
        (
            "Redis redis://r:6379/0?password=hunter2 is unavailable",
            "Redis redis://r:6379/0?password=*** is unavailable",
        ),
    ],
)
def test_keys_and_secret_query_values_are_redacted(text, expected):
    assert redact(text) == expected
    assert redact(expected) == expected  # idempotent


def record(msg: str, *args, **extra) -> logging.LogRecord:
    made = logging.LogRecord("daphne.access", logging.INFO, __file__, 1, msg, args, None)
    made.__dict__.update(extra)
    return made


def test_the_filter_redacts_the_message_its_arguments_and_access_fields():
    made = record('%s "%s"', "127.0.0.1", f"GET /v1/completions?api_key={KEY}", access={"path": f"/?token={KEY}"})

    assert RedactSecrets().filter(made)
    assert made.getMessage() == '127.0.0.1 "GET /v1/completions?api_key=***"'
    assert made.access == {"path": "/?token=***"}


FORMATTERS = {
    "plain": lambda: PlainFormatter("%(message)s"),
    "json": lambda: JsonFormatter("%(message)s"),
}


@pytest.mark.parametrize("formatter", FORMATTERS.values(), ids=FORMATTERS.keys())
def test_the_filter_redacts_a_traceback_in_either_format(formatter):
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError:
        made = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())

    assert RedactSecrets().filter(made)
    text = formatter().format(made)
    assert "Zm9vYmFy" not in text and "sk-cs-AbCd1234.***" in text and "ValueError" in text


@pytest.mark.parametrize("formatter", FORMATTERS.values(), ids=FORMATTERS.keys())
def test_the_filter_redacts_a_stack_in_either_format(formatter):
    made = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, None, sinfo=f"Stack:\n  key = {KEY}")

    assert RedactSecrets().filter(made)
    text = formatter().format(made)
    assert "Zm9vYmFy" not in text and "sk-cs-AbCd1234.***" in text


def test_a_plain_access_line_has_its_fields_as_key_value_pairs():
    made = record(
        "%s %s %s", "POST", "/v1/completions", 200, access={"request_id": "r1", "user": "a b", "prompt_tokens": 5}
    )

    line = PlainFormatter("%(name)s: %(message)s").format(made)
    assert line == 'daphne.access: POST /v1/completions 200 request_id=r1 user="a b" prompt_tokens=5'


def test_a_json_access_line_has_each_field_as_a_key():
    formatter = JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
    )
    made = record(
        "%s %s %s", "POST", "/v1/completions", 429, access={"request_id": "r1", "status": 429, "ttft_ms": None}
    )

    line = json.loads(formatter.format(made))
    assert line["message"] == "POST /v1/completions 429"
    assert (line["level"], line["logger"], line["request_id"], line["status"]) == ("INFO", "daphne.access", "r1", 429)
    assert "access" not in line and "time" in line


def test_daphnes_access_log_goes_through_logging_where_the_filter_redacts_it(caplog):
    from daphne.access import AccessLogGenerator

    from completions_site.logs import route_daphne_access_log

    route_daphne_access_log()
    handler = caplog.handler
    handler.addFilter(RedactSecrets())
    try:
        with caplog.at_level(logging.DEBUG, logger="daphne.access"):
            AccessLogGenerator(sys.stdout)(
                "http",
                "complete",
                {
                    "client": "127.0.0.1:5000",
                    "method": "POST",
                    "path": f"/v1/completions?api_key={KEY}",
                    "status": 401,
                    "size": 10,
                },
            )
            AccessLogGenerator(sys.stdout)("websocket", "rejected", {"client": "127.0.0.1:5000", "path": "/ws/x/"})
    finally:
        handler.removeFilter(handler.filters[-1])
    (http, ws) = caplog.records
    assert http.levelno == logging.DEBUG and ws.levelno == logging.INFO  # our access log has the HTTP line
    assert '"POST /v1/completions?api_key=***" 401 10' in http.getMessage()
    assert "Zm9vYmFy" not in caplog.text


def test_a_message_whose_arguments_do_not_fit_is_still_redacted():
    made = record("%d keys: %s", "not a number", KEY)  # TypeError in getMessage
    made.msg = f"leaked {KEY} %d"

    assert RedactSecrets().filter(made)
    assert "Zm9vYmFy" not in made.getMessage() and "sk-cs-AbCd1234.***" in made.getMessage()


def test_an_unknown_log_format_is_refused_with_the_allowed_values():
    from django.core.exceptions import ImproperlyConfigured

    from completions_site.logs import log_format

    assert log_format("json") == "json"
    with pytest.raises(ImproperlyConfigured, match="plain, json"):
        log_format("xml")
