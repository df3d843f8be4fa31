"""Secrets out of text that is kept: log lines (``completions_site/logs.py``) and usage records.

Two shapes are redacted wherever they appear:

- one of our keys, ``sk-cs-<prefix>.<secret>``: the public prefix stays (it is what the admin
  lists), the secret becomes ``***``; anything else after ``sk-cs-`` (a mangled key) goes whole;
- the value of a query parameter named ``api_key``, ``key``, ``token``, ``access_token``,
  ``apikey`` or ``password`` (any case) in a URL or query string: ``?api_key=***`` (redis-py reads
  a ``REDIS_URL``'s password from its query too).

:func:`redact` is pure and idempotent; a text without either shape comes back unchanged.
"""

from __future__ import annotations

import re

_KEY = re.compile(r"sk-cs-(?:([A-Za-z0-9]{8})\.)?([A-Za-z0-9_\-.~+/=%]*)")
_QUERY = re.compile(r"(?i)((?:^|[?&;\s\"'])(?:api_key|apikey|key|token|access_token|password)=)[^&;\s\"'#]*")
MASK = "***"


def _mask_key(match: re.Match[str]) -> str:
    prefix, secret = match.groups()
    if not secret:
        return match.group(0)  # nothing secret follows (already redacted, or a bare prefix)
    return f"sk-cs-{prefix}.{MASK}" if prefix else f"sk-cs-{MASK}"


def redact(text: str) -> str:
    """``text`` with our keys' secrets and secret-named query values replaced by ``***``."""
    if "sk-cs-" not in text and "=" not in text:
        return text  # the common case, without a regular expression
    text = _KEY.sub(_mask_key, text)
    return _QUERY.sub(lambda m: m.group(1) + MASK, text)
