"""The staff dashboard, self-service accounts and the usage API (``/v1/usage/completions``)."""
from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard and accounts"

    def ready(self) -> None:
        from . import live  # noqa: F401  (connects the usage-record broadcast)
