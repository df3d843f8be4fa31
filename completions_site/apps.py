"""The project's own app: system checks on settings."""

from __future__ import annotations

from django.apps import AppConfig


class CompletionsSiteConfig(AppConfig):
    name = "completions_site"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)
