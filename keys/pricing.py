"""What requests cost: the one place that turns tokens and a model's prices into money.

Prices are :class:`~keys.models.ModelPrice` rows, per million tokens, in one currency (USD by
convention).  Costs are whole *nanos*, billionths of that currency (``NANOS``), an integer that
Redis, the database and the usage rollup add exactly; a request's cost is rounded up to a whole
nano, so a request is never free when its model has a price.  The usage record stores its cost
(:func:`cost_nanos` at the request's prices), so a later price change does not rewrite history.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from .db import DATABASE_DOWN, db_call
from .errors import DatabaseUnavailable
from .models import ModelPrice

NANOS: Final = 10**9
# A process reads the price table again after this long: another process's change applies within it.
CACHE_SECONDS: Final = 10.0


@dataclass(frozen=True)
class Price:
    """One model's prices per million prompt and completion tokens; :data:`FREE` when it has none."""

    prompt_per_million: Decimal = Decimal(0)
    completion_per_million: Decimal = Decimal(0)


FREE: Final = Price()


def cost_nanos(price: Price, prompt_tokens: int, completion_tokens: int) -> int:
    """The cost of ``prompt_tokens`` and ``completion_tokens`` at ``price``, in nanos, rounded up."""
    exact = (prompt_tokens * price.prompt_per_million + completion_tokens * price.completion_per_million) * (
        Decimal(NANOS) / Decimal(10**6)
    )
    return int(exact.to_integral_value(rounding=ROUND_CEILING))


def to_money(nanos: int) -> Decimal:
    """``nanos`` in the prices' currency, e.g. ``1_500_000`` → ``Decimal("0.0015")``."""
    return (Decimal(nanos) / NANOS).normalize() if nanos else Decimal(0)


def to_nanos(amount: Decimal | int | float | str) -> int:
    """``amount`` of the currency in whole nanos (a budget), rounded down."""
    return math.floor(Decimal(str(amount)) * NANOS)


class _PriceTable:
    """This process's copy of the price table, read again after :data:`CACHE_SECONDS` or a change here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prices: dict[str, Price] = {}
        self._read_at = -math.inf

    def stale(self) -> bool:
        return time.monotonic() - self._read_at > CACHE_SECONDS

    def get(self, model: str) -> Price:
        """The model's price (reads the table if stale: call from a database thread)."""
        if self.stale():
            self.reload()
        return self._prices.get(model, FREE)

    def reload(self) -> None:
        prices = {
            row.model: Price(row.prompt_per_million, row.completion_per_million) for row in ModelPrice.objects.all()
        }
        with self._lock:
            self._prices, self._read_at = prices, time.monotonic()

    def forget(self) -> None:
        with self._lock:
            self._read_at = -math.inf


prices = _PriceTable()


def price_of(model: str) -> Price:
    """The price of ``model`` now (sync: may read the table)."""
    return prices.get(model)


async def aprice_of(model: str) -> Price:
    """:func:`price_of` from async code: the database is read only when the copy is stale.

    Raises :class:`~keys.errors.DatabaseUnavailable` when it must be read and does not answer."""
    if prices.stale():
        try:
            await db_call(prices.reload)
        except DATABASE_DOWN as error:
            raise DatabaseUnavailable(error) from error
    return prices.get(model)


@receiver([post_save, post_delete], sender=ModelPrice)
def _price_changed(**kwargs: Any) -> None:
    """A price changed in this process (the admin, the Administration API): read the table again."""
    prices.forget()
