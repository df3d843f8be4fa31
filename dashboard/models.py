"""Site-wide account settings that staff change in the admin (one row)."""

from __future__ import annotations

from django.db import models


class AccountSettings(models.Model):
    """The one row of account settings; :meth:`current` reads it, creating it on first use.

    Self sign-up is off until staff turn it on: a hosted API decides who gets keys.
    """

    self_signup = models.BooleanField(
        default=False,
        verbose_name="self sign-up",
        help_text="Let visitors create their own account at /account/signup/. Off: only staff create users.",
    )

    class Meta:
        verbose_name = "account settings"
        verbose_name_plural = "account settings"

    def __str__(self) -> str:
        return "Account settings"

    @classmethod
    def current(cls) -> AccountSettings:
        settings, _ = cls.objects.get_or_create(pk=1)
        return settings

    def save(self, *args, **kwargs) -> None:
        self.pk = 1  # a singleton: every save writes the one row
        super().save(*args, **kwargs)
