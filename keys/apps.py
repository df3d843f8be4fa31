"""The keys app: API keys for Bearer auth, per-request usage records, their admin and commands."""

from __future__ import annotations

from django.apps import AppConfig


class KeysConfig(AppConfig):
    name = "keys"
    verbose_name = "API keys and usage"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import pricing  # noqa: F401 - its receivers forget the price table when a price changes
