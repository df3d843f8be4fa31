"""The api app: no models; registered so Django finds its templates-free views and checks."""

from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    label = "api"
