"""The staff dashboard and its live updates; also the sign-up switch (``AccountSettings``) and its admin."""

from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard and accounts"

    def ready(self) -> None:
        from . import live  # noqa: F401  (connects the usage-record broadcast)
