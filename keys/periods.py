"""UTC periods, one definition for limits, stats and the usage API: days, months and buckets.

Every period is half-open, ``[start, end)``, and aligned to UTC (``TIME_ZONE = "UTC"``), so a day
or a month means the same on every database and every server.  Months are named ``"YYYY-MM"``
where a counter is keyed by them (the monthly quota); a money budget's period is named by
:func:`budget_period_name`.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from datetime import timezone as dt_timezone

UTC = dt_timezone.utc
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def now() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)


def usage_day(moment: datetime) -> date:
    """The UTC calendar day of ``moment`` (an aware datetime)."""
    return moment.astimezone(UTC).date()


def midnight(day: date) -> datetime:
    """The start of ``day`` (00:00 UTC), aware."""
    return datetime.combine(day, time.min, tzinfo=UTC)


def floor_hour(moment: datetime) -> datetime:
    """The start of ``moment``'s hour (its own time zone, UTC throughout the project)."""
    return moment.replace(minute=0, second=0, microsecond=0)


def floor_day(moment: datetime) -> datetime:
    """The start of ``moment``'s day (its own time zone, UTC throughout the project)."""
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def month_start(moment: datetime | None = None) -> datetime:
    """Midnight UTC on the first of ``moment``'s month (default: now)."""
    return floor_day((moment or now()).astimezone(UTC)).replace(day=1)


def month_name(moment: datetime | None = None) -> str:
    """``"YYYY-MM"`` of ``moment`` in UTC (default: now): the key of a month's quota counter."""
    return (moment or now()).astimezone(UTC).strftime("%Y-%m")


def month_bounds(month: str) -> tuple[date, date]:
    """The first day of ``month`` (``"YYYY-MM"``) and the first day of the month after it."""
    year, number = map(int, month.split("-"))
    first = date(year, number, 1)
    return first, date(year + number // 12, number % 12 + 1, 1)


def bucket_start(timestamp: int, width_seconds: int) -> int:
    """The start of the ``width_seconds`` bucket holding ``timestamp`` (Unix seconds, UTC-aligned)."""
    return timestamp - timestamp % width_seconds


# A budget's periods: when its spend starts again (keys.models.BUDGET_PERIODS).
MONTHLY, DAILY, NEVER = "monthly", "daily", "never"
ALL_TIME = "all"  # the one period of a budget that never resets


def budget_period_name(period: str, moment: datetime | None = None) -> str:
    """The name of ``moment``'s budget period (default: now): ``"YYYY-MM"`` (monthly),
    ``"YYYY-MM-DD"`` (daily) or ``"all"`` (never)."""
    moment = (moment or now()).astimezone(UTC)
    if period == DAILY:
        return moment.strftime("%Y-%m-%d")
    if period == NEVER:
        return ALL_TIME
    return month_name(moment)


def budget_period_bounds(name: str) -> tuple[datetime | None, datetime | None]:
    """``[start, end)`` of the budget period ``name`` (:func:`budget_period_name`); ``None`` is unbounded."""
    if name == ALL_TIME:
        return None, None
    if len(name) == len("YYYY-MM"):
        first, following = month_bounds(name)
        return midnight(first), midnight(following)
    day = date.fromisoformat(name)
    return midnight(day), midnight(day + DAY)
