"""``manage.py rebuild_usage_rollup [--from DAY] [--to DAY]``: recompute the daily rollup from the records.

The rollup is kept in step with the records as they are written; this rebuilds it after records
were imported, deleted, or written by an older version.  Days are UTC dates (``YYYY-MM-DD``).
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from keys.usage import rebuild_daily_usage


class Command(BaseCommand):
    help = "Recompute the daily usage rollup (per key, model and UTC day) from the usage records."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--from", dest="first", type=date.fromisoformat, help="First day, YYYY-MM-DD (default: all)."
        )
        parser.add_argument("--to", dest="last", type=date.fromisoformat, help="Last day, YYYY-MM-DD (default: all).")

    def handle(self, *args: Any, first: date | None, last: date | None, **options: Any) -> None:
        rows = rebuild_daily_usage(first, last)
        span = f"from {first or 'the first record'} to {last or 'the last record'}"
        self.stdout.write(self.style.SUCCESS(f"Rebuilt {rows} daily usage rows {span}."))
