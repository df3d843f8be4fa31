"""The HTTPS and debug settings come from the environment (``completions_site/settings.py``), and
are off where a fresh checkout runs: debug off unless asked for, plain-HTTP cookies, no HSTS."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from testing.live_server import ROOT

READ = """
import json
from django.conf import settings
import django
django.setup()
print(json.dumps({name: getattr(settings, name, None) for name in %r}, default=str))
"""
NAMES = [
    "DEBUG",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SECURE_SSL_REDIRECT",
    "SECURE_PROXY_SSL_HEADER",
    "SILENCED_SYSTEM_CHECKS",
]


def settings_under(environment: dict[str, str], names: list[str] = NAMES) -> dict:
    """The settings a fresh process reads with ``environment`` (and none of this one's DJANGO_*)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("DJANGO_")}
    env.update(environment, DJANGO_SETTINGS_MODULE="completions_site.settings")
    result = subprocess.run(
        [sys.executable, "-c", READ % names], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_fresh_checkout_runs_without_debug_and_without_https_settings():
    assert settings_under({}) == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_HSTS_PRELOAD": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_PROXY_SSL_HEADER": None,
        "SILENCED_SYSTEM_CHECKS": [],
    }


def test_the_https_settings_follow_the_environment():
    assert settings_under(
        {
            "DJANGO_DEBUG": "true",
            "DJANGO_SECURE_COOKIES": "true",
            "DJANGO_SECURE_HSTS_SECONDS": "31536000",
            "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
            "DJANGO_SECURE_HSTS_PRELOAD": "true",
            "DJANGO_SECURE_SSL_REDIRECT": "true",
            "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
            "DJANGO_SILENCED_SYSTEM_CHECKS": "security.W021,axes.W002",
        }
    ) == {
        "DEBUG": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "SILENCED_SYSTEM_CHECKS": ["security.W021", "axes.W002"],
    }


CORS = ["CORS_ALLOWED_ORIGINS", "CORS_ALLOW_ALL_ORIGINS", "CORS_ALLOW_CREDENTIALS"]


def test_cors_allows_no_origin_by_default_and_never_credentials():
    assert settings_under({}, CORS) == {
        "CORS_ALLOWED_ORIGINS": [],
        "CORS_ALLOW_ALL_ORIGINS": False,
        "CORS_ALLOW_CREDENTIALS": False,
    }
    assert settings_under({"API_CORS_ALLOWED_ORIGINS": "https://a.example,http://localhost:3000"}, CORS) == {
        "CORS_ALLOWED_ORIGINS": ["https://a.example", "http://localhost:3000"],
        "CORS_ALLOW_ALL_ORIGINS": False,
        "CORS_ALLOW_CREDENTIALS": False,
    }
    assert settings_under({"API_CORS_ALLOWED_ORIGINS": "*"}, CORS) == {
        "CORS_ALLOWED_ORIGINS": [],
        "CORS_ALLOW_ALL_ORIGINS": True,
        "CORS_ALLOW_CREDENTIALS": False,
    }


def test_the_sign_in_lock_out_follows_the_environment():
    names = ["AXES_ENABLED", "AXES_FAILURE_LIMIT", "AXES_COOLOFF_TIME", "AXES_LOCKOUT_PARAMETERS"]

    assert settings_under({}, names) == {
        "AXES_ENABLED": True,
        "AXES_FAILURE_LIMIT": 5,
        "AXES_COOLOFF_TIME": "0:15:00",
        "AXES_LOCKOUT_PARAMETERS": [["username", "ip_address"]],
    }
    assert (
        settings_under({"SIGNIN_FAILURE_LIMIT": "3", "SIGNIN_LOCKOUT_MINUTES": "60"}, names)["AXES_COOLOFF_TIME"]
        == "1:00:00"
    )
    assert settings_under({"SIGNIN_FAILURE_LIMIT": "0"}, names)["AXES_ENABLED"] is False
