"""``manage.py revoke_api_key PREFIX``: revoke one key, for good, from the shell.

``PREFIX`` is the 8 characters after ``sk-cs-`` (the admin lists them); a whole key works too.
The next request with the key is refused on every process: keys are read from the database on
each request.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from keys.models import KEY_NAMESPACE, APIKey


class Command(BaseCommand):
    help = "Revoke the API key with this prefix (the 8 characters after “sk-cs-”). Revocation is permanent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix", help="The key's prefix, e.g. Ab3dE6gH (or the whole key).")

    def handle(self, *args: Any, prefix: str, **options: Any) -> None:
        prefix = prefix.strip().removeprefix(KEY_NAMESPACE).split(".", 1)[0]
        try:
            api_key = APIKey.objects.select_related("owner").get(prefix=prefix)
        except APIKey.DoesNotExist:
            raise CommandError(f"No API key has the prefix {prefix!r}.") from None
        if not api_key.revoke():
            self.stdout.write(
                f"API key “{api_key.name}” ({prefix}) was already revoked at {api_key.revoked_at:%Y-%m-%d %H:%M:%S} UTC."
            )
            return
        self.stdout.write(
            self.style.SUCCESS(
                f"Revoked API key “{api_key.name}” of {api_key.owner.get_username()} ({prefix}); "
                "its next request is refused on every server."
            )
        )
