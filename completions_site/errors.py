"""What error reports may show of the settings.

Django's filter hides a setting whose name looks secret (``SECRET_KEY``, ``METRICS_TOKEN``,
``DATABASES``' ``PASSWORD``), but not a password written inside a URL: ``REDIS_URL``, and the copy
of it in ``CHANNEL_LAYERS``, would show ``redis://:hunter2@redis:6379/0`` on the debug page.
"""

from __future__ import annotations

import re
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

# scheme://user:password@host: the password, up to the last "@" before the host.
URL_PASSWORD = re.compile(r"(?P<prefix>[a-z][a-z0-9+.-]*://[^/?#:@\s]*:)[^/?#\s]*(?=@)", re.IGNORECASE)
# ?password=... or &password=... in a URL's query (redis-py reads a password there too).
QUERY_PASSWORD = re.compile(r"(?P<prefix>[?&]password=)[^&#\s'\"]*", re.IGNORECASE)


def mask_url_passwords(text: str, substitute: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` and every ``password=``
    query parameter in it replaced."""
    text = URL_PASSWORD.sub(lambda match: match["prefix"] + substitute, text)
    return QUERY_PASSWORD.sub(lambda match: match["prefix"] + substitute, text)


class SafeSettingsFilter(SafeExceptionReporterFilter):
    """Django's filter, and a URL's password masked in any string setting, however deeply nested."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str):  # lazy strings too (axes' messages), rendered here
            return mask_url_passwords(str(cleansed), self.cleansed_substitute)
        return cleansed
