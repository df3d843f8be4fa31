"""The accounts app: no models of its own (the sign-up switch, ``AccountSettings``, stays in the
dashboard app with its migration history and admin URL)."""

from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts"
