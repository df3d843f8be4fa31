"""``manage.py create_api_key --name NAME [--user USERNAME]``: issue a key from the shell.

The new key is printed alone on the last line of the output, so scripts can take ``tail -n 1``.
"""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, CommandParser

from keys.models import APIKey


class Command(BaseCommand):
    help = "Create an API key and print it once (alone on the last line). It is not stored in plain text."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True, help="What the key is for, e.g. “laptop”.")
        parser.add_argument("--user", help="The owner's username (default: the first superuser).")

    def handle(self, *args: Any, name: str, user: str | None, **options: Any) -> None:
        owner = find_owner(user)
        api_key, plaintext = APIKey.objects.create_key(name=name, owner=owner)
        self.stdout.write(
            f"Created API key “{api_key.name}” for {owner.get_username()} (prefix {api_key.prefix}). "
            "It is shown only this once; store it now:"
        )
        self.stdout.write(plaintext)


def find_owner(username: str | None) -> AbstractBaseUser:
    """The user called ``username``, or the first superuser; ``CommandError`` if there is none."""
    users = get_user_model()._default_manager
    if username is not None:
        try:
            return users.get_by_natural_key(username)
        except users.model.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
    first_superuser = users.filter(is_superuser=True).order_by("pk").first()
    if first_superuser is None:
        raise CommandError(
            "There is no superuser to own the key; pass --user USERNAME (or run `manage.py bootstrap`)."
        )
    return first_superuser
