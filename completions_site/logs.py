"""Logging: secrets redacted from every line, plain or JSON lines, daphne's access log through logging.

``settings.LOGGING`` puts :class:`RedactSecrets` on the console handler, so every record that
reaches it (ours, Django's, daphne's, twisted's) has our keys' secrets and secret-named query
values (``api_key``, ``key``, ``token``) replaced by ``***`` (:func:`keys.redaction.redact`), in
its message, its arguments, its traceback, its stack and its extra fields.  ``LOG_FORMAT=json`` picks
:class:`JsonFormatter` (python-json-logger): one JSON object per line with ``time``, ``level``,
``logger``, ``message`` and, for the access log (:mod:`api.access`), each of its fields as a key;
the default :class:`PlainFormatter` writes the access fields as ``key=value`` after the message.

daphne writes its own access log straight to stdout, path and query string included, outside
logging and so outside any filter.  :func:`route_daphne_access_log` sends it through the logger
``daphne.access`` instead: WebSocket events at INFO, HTTP requests at DEBUG (our own access log,
``completions.access``, already has one line for each).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from keys.redaction import redact

ACCESS = "access"  # the record attribute holding an access line's fields (api/access.py)
FORMATS = ("plain", "json")  # LOG_FORMAT's values: the formatters' names in settings.LOGGING


def log_format(value: str) -> str:
    """``LOG_FORMAT``, checked: one of :data:`FORMATS`, or ``ImproperlyConfigured`` naming them."""
    if value not in FORMATS:
        raise ImproperlyConfigured(f"LOG_FORMAT={value!r}: use one of {', '.join(FORMATS)}.")
    return value


class RedactSecrets(logging.Filter):
    """Redacts every record in place: message (with its arguments), traceback, string extras."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit the format: logging would
            message = str(record.msg)  # print them raw in its own error report; keep the format
            record.args = None
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
            # python-json-logger formats exc_info again (not exc_text): only the redacted text stays.
            record.exc_info = None
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        fields = getattr(record, ACCESS, None)
        if isinstance(fields, dict):
            setattr(record, ACCESS, {k: redact(v) if isinstance(v, str) else v for k, v in fields.items()})
        return True


class PlainFormatter(logging.Formatter):
    """``time LEVEL logger: message``, then an access line's fields as ``key=value`` (without the
    method, path and status, which its message already says)."""

    IN_MESSAGE = frozenset({"method", "path", "status"})

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, ACCESS, None)
        if isinstance(fields, dict):
            line += "".join(f" {key}={_plain(value)}" for key, value in fields.items() if key not in self.IN_MESSAGE)
        return line


def _plain(value: Any) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or not text) else text


class JsonFormatter(_JsonFormatter):
    """python-json-logger's formatter with an access line's fields at the top level of the object."""

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        fields = log_data.pop(ACCESS, None)
        if isinstance(fields, dict):
            log_data.update(fields)


def route_daphne_access_log() -> None:
    """Make daphne's access log (``daphne.access.AccessLogGenerator``) write through logging.

    daphne's CLI builds the generator around ``sys.stdout``; its ``write_entry`` is the one method
    that writes, so replacing it on the class reroutes every entry (the NCSA line is kept).
    """
    from daphne.access import AccessLogGenerator

    access_logger = logging.getLogger("daphne.access")

    def write_entry(self, host, date, request, status=None, length=None, ident=None, user=None):
        level = logging.INFO if request.startswith("WS") else logging.DEBUG
        if access_logger.isEnabledFor(level):
            access_logger.log(
                level,
                '%s %s %s [%s] "%s" %s %s',
                host,
                ident or "-",
                user or "-",
                date.strftime("%d/%b/%Y:%H:%M:%S"),
                request,
                status or "-",
                length or "-",
            )

    AccessLogGenerator.write_entry = write_entry
