"""Template filters for figures: shares as percentages, durations in ms or s."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def percent(value: float | None) -> str:
    """``0.0412`` → ``"4.1%"``; ``None`` → ``"–"``."""
    if value is None:
        return "–"
    return f"{value * 100:.1f}%"


@register.filter
def ms(value: float | None) -> str:
    """A duration in milliseconds, readable: ``"85 ms"``, ``"1.24 s"``; ``None`` → ``"–"``."""
    if value is None:
        return "–"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.2f} s"


@register.filter
def thousands(value: int | float | None) -> str:
    """``1234567`` → ``"1,234,567"``; ``None`` → ``"0"``.  Integers stay exact (no float on the way)."""
    return f"{round(value or 0):,}"


@register.filter
def money(nanos: int | None) -> str:
    """A cost in nanos (``keys.pricing``) as money: ``13000`` → ``"0.000013"``, ``0`` → ``"0.00"``."""
    from keys.pricing import to_money

    amount = to_money(nanos or 0)
    return f"{amount:.2f}" if amount == round(amount, 2) else f"{amount:f}"
