"""The Administration API: admin keys and the operators' routes under ``/v1/organization/``."""

from django.apps import AppConfig


class OrganizationConfig(AppConfig):
    """OpenAI's Administration API on Django REST framework (users, their API keys, limits, admin keys)."""

    name = "organization"
    verbose_name = "Administration API"

    def ready(self) -> None:
        from . import schema  # noqa: F401  (drf-spectacular's extensions register on import)
