"""System checks on settings: fail loudly, with ids and hints, before a bad deployment serves."""
from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.security, deploy=False)
def check_secret_key(app_configs, **kwargs) -> list[Error]:
    """A production start (DJANGO_DEBUG=false) must not use the well-known default secret key."""
    if not settings.DEBUG and settings.SECRET_KEY == settings.DEFAULT_SECRET_KEY:
        return [
            Error(
                "DJANGO_SECRET_KEY is the default development key while DJANGO_DEBUG is false.",
                hint="Set DJANGO_SECRET_KEY to a long random value, e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`.",
                id="completions_site.E001",
            )
        ]
    return []
