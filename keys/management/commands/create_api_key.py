"""``manage.py create_api_key --name NAME [--user USERNAME] [limits]``: issue a key from the shell.

Limits (each optional; a key without one uses the ``API_DEFAULT_*`` setting, and 0 means no
limit): ``--rpm``, ``--tpm``, ``--max-concurrent``, ``--monthly-tokens``; ``--models a,b`` keeps
the key to those models; ``--model-limit MODEL:RPM:TPM`` (repeatable) gives it requests and tokens
per minute of its own for one model (either left empty: none); ``--expires-in 30d`` (``s``, ``m``, ``h``, ``d`` or ``w``) sets an expiry.
The new key is printed alone on the last line of the output, so scripts can take ``tail -n 1``.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from keys.errors import TooManyKeys
from keys.models import APIKey, parse_model_list

if TYPE_CHECKING:
    from django.contrib.auth.models import User

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DURATION = re.compile(r"(\d+)([smhdw])")


def duration(text: str) -> timedelta:
    """``"30d"`` → 30 days; one number and one unit of ``s m h d w``."""
    match = _DURATION.fullmatch(text.strip())
    if not match or int(match[1]) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90m, 12h, 30d or 2w")
    try:
        span = timedelta(**{_UNITS[match[2]]: int(match[1])})
        timezone.now() + span  # an expiry past the year 9999 has no date
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is too long: an expiry must fall before the year 10000") from None
    return span


def model_limit(text: str) -> tuple[str, dict[str, int]]:
    """``"big:60:100000"`` → ``("big", {"rpm": 60, "tpm": 100000})``; an empty number is no limit
    (``"big::5000"``).  The model id may hold colons itself: the last two fields are the numbers."""
    model, _, numbers = text.rpartition(":")
    model, _, rpm = model.rpartition(":")
    if not model or not all(number == "" or number.isdigit() for number in (rpm, numbers)):
        raise argparse.ArgumentTypeError(f"{text!r} is not MODEL:RPM:TPM, e.g. big:60:100000 or big::5000")
    return model, {name: int(number) for name, number in (("rpm", rpm), ("tpm", numbers)) if number}


def limit(text: str) -> int:
    """A limit: a whole number, 0 for none."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0 means no limit)")
    return int(text)


class Command(BaseCommand):
    help = "Create an API key and print it once (alone on the last line). It is not stored in plain text."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True, help="What the key is for, e.g. “laptop”.")
        parser.add_argument("--user", help="The owner's username (default: the first superuser).")
        limits = parser.add_argument_group(
            "limits", "Without one, the key uses the API_DEFAULT_* setting; 0 means no limit."
        )
        limits.add_argument("--rpm", type=limit, help="Requests per minute.")
        limits.add_argument("--tpm", type=limit, help="Tokens (prompt plus completion) per minute.")
        limits.add_argument("--max-concurrent", type=limit, help="Requests in flight at once.")
        limits.add_argument("--monthly-tokens", type=limit, help="Tokens per calendar month (UTC).")
        limits.add_argument("--models", default="", help="Comma-separated model ids the key may use (default: all).")
        limits.add_argument(
            "--model-limit",
            type=model_limit,
            action="append",
            default=[],
            metavar="MODEL:RPM:TPM",
            help="Requests and tokens per minute for one model, beside the key's limits (repeat per model; "
            "leave a number empty for none), e.g. big:60:100000.",
        )
        limits.add_argument("--expires-in", type=duration, help="Expiry from now, e.g. 30d, 12h, 2w (default: never).")

    def handle(self, *args: Any, name: str, user: str | None, **options: Any) -> None:
        owner = find_owner(user)
        expires_in = options["expires_in"]
        api_key = APIKey(
            name=name,
            owner=owner,
            expires_at=timezone.now() + expires_in if expires_in else None,
            rpm_limit=options["rpm"],
            tpm_limit=options["tpm"],
            max_concurrent=options["max_concurrent"],
            monthly_token_quota=options["monthly_tokens"],
            allowed_models=",".join(parse_model_list(options["models"])),
            model_limits=dict(options["model_limit"]),
        )
        try:  # the model's own validation, as in the admin (allowed_models' ids, model_limits, field lengths)
            api_key.full_clean(exclude=["prefix", "hashed_key"])
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from None
        try:
            plaintext = APIKey.objects.issue(api_key)
        except TooManyKeys as error:
            raise CommandError(str(error)) from None
        self.stdout.write(
            f"Created API key “{api_key.name}” for {owner.get_username()} (prefix {api_key.prefix}). "
            "It is shown only this once; store it now:"
        )
        self.stdout.write(plaintext)


def find_owner(username: str | None) -> User:
    """The user called ``username``, or the first superuser; ``CommandError`` if there is none."""
    users = get_user_model()._default_manager
    if username is not None:
        try:
            return users.get_by_natural_key(username)
        except users.model.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
    first_superuser = users.filter(is_superuser=True).order_by("pk").first()
    if first_superuser is None:
        raise CommandError("There is no superuser to own the key; pass --user USERNAME (or run `manage.py bootstrap`).")
    return first_superuser
