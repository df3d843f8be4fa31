"""A server start refuses what would be unsafe where it listens (``completions_site/startup.py``):
debug mode or the default secret key on an address other machines reach, the default key with
debug off anywhere; ``make run``'s development loop on the loopback still starts."""

from __future__ import annotations

import logging
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from completions_site.startup import check_before_serving

APP = "completions_site.asgi:application"
A_KEY = "k3y-" + "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMN"


@pytest.fixture
def bind(monkeypatch):
    """Make this process look like ``daphne -b HOST``."""

    def to(host: str) -> None:
        monkeypatch.setattr(sys, "argv", ["/srv/.venv/bin/daphne", "-b", host, "-p", "8000", APP])

    return to


def test_make_runs_development_loop_on_the_loopback_starts_with_debug_and_the_default_key(bind, settings):
    bind("127.0.0.1")
    settings.DEBUG = True
    settings.SECRET_KEY = settings.DEFAULT_SECRET_KEY

    check_before_serving()  # no refusal


def test_debug_on_a_non_loopback_address_is_refused_with_what_to_set(bind, settings):
    bind("0.0.0.0")
    settings.DEBUG = True
    settings.SECRET_KEY = A_KEY

    with pytest.raises(ImproperlyConfigured) as refusal:
        check_before_serving()

    message = str(refusal.value)
    assert "completions_site.E010" in message
    assert "tcp:port=8000:interface=0.0.0.0" in message
    assert "DJANGO_DEBUG=false" in message
    assert "E001" not in message


@pytest.mark.parametrize(("host", "debug"), [("0.0.0.0", False), ("192.168.1.20", False), ("127.0.0.1", False)])
def test_the_default_secret_key_is_refused_off_the_loopback_or_with_debug_off(bind, settings, host, debug):
    bind(host)
    settings.DEBUG = debug
    settings.SECRET_KEY = settings.DEFAULT_SECRET_KEY

    with pytest.raises(ImproperlyConfigured) as refusal:
        check_before_serving()

    message = str(refusal.value)
    assert "completions_site.E001" in message
    assert "DJANGO_SECRET_KEY" in message and "secrets.token_urlsafe(50)" in message  # how to get one


def test_both_refusals_are_listed_at_once(bind, settings):
    bind("0.0.0.0")
    settings.DEBUG = True
    settings.SECRET_KEY = settings.DEFAULT_SECRET_KEY

    with pytest.raises(ImproperlyConfigured) as refusal:
        check_before_serving()

    assert "completions_site.E001" in str(refusal.value) and "completions_site.E010" in str(refusal.value)


def test_a_production_start_logs_djangos_deployment_warnings(bind, settings, caplog):
    bind("0.0.0.0")
    settings.DEBUG = False
    settings.SECRET_KEY = A_KEY
    settings.SECURE_HSTS_SECONDS = 0

    with caplog.at_level(logging.WARNING, logger="completions_site.startup"):
        check_before_serving()

    assert any("security.W004" in record.getMessage() for record in caplog.records)


def test_a_silenced_deployment_warning_is_not_logged(bind, settings, caplog):
    bind("0.0.0.0")
    settings.DEBUG = False
    settings.SECRET_KEY = A_KEY
    settings.SILENCED_SYSTEM_CHECKS = ["security.W004"]

    with caplog.at_level(logging.WARNING, logger="completions_site.startup"):
        check_before_serving()

    assert not any("security.W004" in record.getMessage() for record in caplog.records)


def test_manage_py_commands_run_with_the_default_key_and_debug_off(monkeypatch, settings):
    monkeypatch.setattr(sys, "argv", ["manage.py", "createsuperuser"])
    settings.DEBUG = False
    settings.SECRET_KEY = settings.DEFAULT_SECRET_KEY
    from django.core import checks

    assert [m.id for m in checks.run_checks() if m.is_serious()] == []


@pytest.mark.parametrize(("limit", "minutes"), [(-1, 15), (5, 0)])
def test_a_sign_in_lock_out_that_cannot_work_is_refused(settings, limit, minutes):
    settings.SIGNIN_FAILURE_LIMIT, settings.SIGNIN_LOCKOUT_MINUTES = limit, minutes
    from completions_site.checks import check_signin_settings

    assert [error.id for error in check_signin_settings(None)] == ["completions_site.E011"]
