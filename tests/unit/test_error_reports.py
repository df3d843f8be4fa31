"""Error reports show no secret of the settings (``completions_site/errors.py``): not a setting
whose name says so, and not a password inside a URL, such as ``REDIS_URL``'s in ``CHANNEL_LAYERS``."""

from __future__ import annotations

import sys

import pytest
from django.test import RequestFactory
from django.views.debug import get_default_exception_reporter_filter, technical_500_response

from completions_site.errors import mask_url_passwords

PASSWORD = "hunter2-redis-Pa55"
REDIS_URL = f"redis://:{PASSWORD}@redis.internal:6379/0"
TOKEN = "metrics-token-secret-value"


@pytest.fixture
def redis_with_a_password(settings):
    settings.REDIS_URL = REDIS_URL
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
    }
    settings.METRICS_TOKEN = TOKEN


def test_the_filter_masks_the_password_of_every_url_in_the_settings(redis_with_a_password):
    shown = get_default_exception_reporter_filter().get_safe_settings()

    assert shown["REDIS_URL"] == "redis://:********************@redis.internal:6379/0"
    assert shown["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"] == [shown["REDIS_URL"]]
    assert shown["METRICS_TOKEN"] == "********************"


def debug_page() -> str:
    """Django's debug page for an error raised here (its source lines are on the page)."""
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        return technical_500_response(RequestFactory().get("/admin/"), *sys.exc_info()).content.decode()


def test_the_debug_page_shows_no_secret(redis_with_a_password, settings):
    settings.DEBUG = True

    page = debug_page()

    assert "CHANNEL_LAYERS" in page and "redis.internal" in page  # the settings are listed ...
    assert PASSWORD not in page and TOKEN not in page  # ... without their secrets


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("redis://user:p%40ss@host:6379/0", "redis://user:***@host:6379/0"),
        ("postgres://completions:s3cret@db/x", "postgres://completions:***@db/x"),
        ("rediss://:a@b@host", "rediss://:***@host"),
        ("redis://host:6379/0", "redis://host:6379/0"),  # no credentials: unchanged
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        ("redis://host:6379/0?password=hunter2&db=1", "redis://host:6379/0?password=***&db=1"),
        ("unix:///run/redis.sock?password=hunter2", "unix:///run/redis.sock?password=***"),
    ],
)
def test_url_passwords_are_masked(text, masked):
    assert mask_url_passwords(text, "***") == masked
