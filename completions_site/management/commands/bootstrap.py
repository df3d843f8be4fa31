"""``manage.py bootstrap``: first-run set-up, run by ``make run`` before the server starts.

On an empty user table it creates the superuser ``admin`` (random password) and an API key named
``default`` and prints both once; Django stores only the password hash and we only the key hash.
When users exist it creates nothing and says how to make more keys, so it is safe on every start.
"""

from __future__ import annotations

import os
import secrets
import shlex
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from inference.models_config import ModelsConfigError, read_models_config
from keys.models import APIKey

ADMIN_USERNAME = "admin"
DEFAULT_KEY_NAME = "default"


class Command(BaseCommand):
    help = "Create the first superuser and API key if the database has no users; otherwise explain how to add keys."

    def handle(self, *args: Any, **options: Any) -> None:
        base_url = server_url()
        users = get_user_model()._default_manager
        if users.exists():
            self.stdout.write(already_set_up_message(base_url))
            return
        with transaction.atomic():
            password = secrets.token_urlsafe(12)
            admin = users.create_superuser(username=ADMIN_USERNAME, email="", password=password)
            _, plaintext = APIKey.objects.create_key(name=DEFAULT_KEY_NAME, owner=admin)
        self.stdout.write(self.style.SUCCESS(first_run_message(base_url, password, plaintext)))


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")  # daphne's "every address", which no client can call


def server_url() -> str:
    """``http://HOST:PORT`` from the same ``HOST``/``PORT`` variables the Makefile hands daphne; for a
    wildcard ``HOST`` (every address), the first name of ``ALLOWED_HOSTS`` (the server refuses any
    other ``Host``), else the loopback."""
    host = os.environ.get("HOST") or "127.0.0.1"
    if host in WILDCARD_HOSTS:
        names = [name for name in settings.ALLOWED_HOSTS if name != "*" and not name.startswith(".")]
        host = names[0] if names else "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address in a URL (RFC 3986, section 3.2.2)
    port = os.environ.get("PORT") or "8000"
    return f"http://{host}:{port}"


def example_model() -> str:
    """The model the welcome's curl names: the first of ``MODELS_CONFIG``'s models, read as the server
    reads them, else ``MODEL_ID`` (a file that cannot be served is the system checks' to report, not
    the welcome's)."""
    if settings.MODELS_CONFIG:
        try:
            return read_models_config(settings.MODELS_CONFIG)[0].id
        except ModelsConfigError:
            pass
    return settings.MODEL_ID


def first_run_message(base_url: str, password: str, plaintext: str) -> str:
    """The one-time welcome: admin credentials, the API key and a curl that uses it."""
    body = f'{{"model": "{example_model()}", "prompt": "Once upon a time", "max_tokens": 32}}'
    return f"""
completions-site is set up. These credentials are shown only this once; store them now.

  Admin site: {base_url}/admin/
  Username:   {ADMIN_USERNAME}
  Password:   {password}
  API key:    {plaintext}

Try it:

  curl {base_url}/v1/completions \\
    -H "Authorization: Bearer {plaintext}" \\
    -H "Content-Type: application/json" \\
    -d {shlex.quote(body)}
"""


def already_set_up_message(base_url: str) -> str:
    """The message for every later start: nothing created, here is how to make more keys."""
    return (
        "Users exist; bootstrap created nothing. To create another API key:\n"
        "  .venv/bin/python manage.py create_api_key --name NAME --user USERNAME\n"
        f"or use the admin: {base_url}/admin/keys/apikey/add/"
    )
