"""``manage.py create_admin_key --name NAME [--user USERNAME] [--scope read_only] [--expires-in 30d]``: an
admin key from the shell.

The key (``sk-cs-admin-...``) authenticates the Administration API (``/v1/organization/...``) only;
``--scope read_only`` makes a key that may only read it (default: ``owner``, everything).
Its owner must be staff (default: the first superuser).  The key is printed alone on the last line
of the output, so scripts can take ``tail -n 1``; it is not stored in plain text.
"""

from __future__ import annotations

from typing import Any, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from keys.management.commands.create_api_key import duration, find_owner
from organization.models import AdminAPIKey, Scope


class Command(BaseCommand):
    help = "Create an admin key for the Administration API and print it once (alone on the last line)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True, help="What the key is for, e.g. “billing sync”.")
        parser.add_argument("--user", help="The owner's username, a staff user (default: the first superuser).")
        parser.add_argument(
            "--scope",
            choices=Scope.values,
            default=Scope.OWNER,
            help="owner: every call of the Administration API (default); read_only: reads (GET) only.",
        )
        parser.add_argument("--expires-in", type=duration, help="Expiry from now, e.g. 30d, 12h, 2w (default: never).")

    def handle(self, *args: Any, name: str, user: str | None, scope: str, expires_in: Any, **options: Any) -> None:
        owner = find_owner(user)
        if not (owner.is_active and getattr(owner, "is_staff", False)):
            raise CommandError(f"{owner.get_username()!r} is not active staff; an admin key acts for staff only.")
        if not name.strip() or len(name) > cast(int, AdminAPIKey._meta.get_field("name").max_length):
            raise CommandError("--name must be 1 to 100 characters.")
        admin_key, plaintext = AdminAPIKey.objects.create_key(
            name=name, owner=owner, expires_at=timezone.now() + expires_in if expires_in else None, scope=scope
        )
        self.stdout.write(
            f"Created {admin_key.get_scope_display()} admin key “{admin_key.name}” for {owner.get_username()} "
            f"(prefix {admin_key.prefix}). "
            "It is shown only this once; store it now:"
        )
        self.stdout.write(plaintext)
