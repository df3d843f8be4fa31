"""One log line per event: a refused request is the access line alone, not Django's warning too."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_a_4xx_is_not_logged_again_by_django_request(tiny_api, caplog):
    with caplog.at_level(logging.DEBUG):
        assert Client().get("/v1/models").status_code == 401

    assert [r for r in caplog.records if r.name == "django.request"] == []


def test_django_request_still_logs_errors():
    logger = logging.getLogger("django.request")

    assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
