"""The recipes in ``deploy/`` are safe to put on the internet: Django's deployment checks pass with
the settings they ship, compose holds no password, and the image serves alone (migrating into its
volume, health-checked), believing proxy headers only when told."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testing.live_server import ROOT

DEPLOY = ROOT / "deploy"


def env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines, as systemd's EnvironmentFile and compose's env_file read them."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def deploy_environment() -> dict[str, str]:
    """env.example with a real secret, and the settings compose.yaml adds for the servers."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    app = {name: str(value) for name, value in compose["x-app"]["environment"].items()}
    app = {
        name: value.replace("${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD in deploy/.env}", "pw")
        for name, value in app.items()
    }
    app["METRICS_ALLOWED_IPS"] = app["METRICS_ALLOWED_IPS"].replace(
        "${COMPOSE_SUBNET:-172.29.64.0/24}", "172.29.64.0/24"
    )
    return {**env_file(DEPLOY / "env.example"), **app, "DJANGO_SECRET_KEY": secrets.token_urlsafe(50)}


def test_djangos_deployment_checks_pass_with_deploys_settings():
    env = {name: value for name, value in os.environ.items() if not name.startswith(("DJANGO_", "API_", "METRICS_"))}
    env.update(deploy_environment())
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_with_the_example_secret_left_in_place_the_deployment_checks_fail():
    env = {name: value for name, value in os.environ.items() if not name.startswith("DJANGO_")}
    env.update({**deploy_environment(), "DJANGO_SECRET_KEY": "insecure-development-key-change-me"})
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert result.returncode != 0 and "completions_site.E001" in result.stderr


def test_compose_writes_no_password_and_lets_prometheus_scrape():
    text = (DEPLOY / "compose.yaml").read_text()
    compose = yaml.safe_load(text)

    assert compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert ":completions@" not in text
    subnet = compose["networks"]["backend"]["ipam"]["config"][0]["subnet"]
    assert subnet in compose["x-app"]["environment"]["METRICS_ALLOWED_IPS"]
    assert compose["services"]["prometheus"]["networks"] == ["backend"]
    assert "POSTGRES_PASSWORD" in env_file(DEPLOY / "env.example")


def test_the_image_checks_its_health_and_keeps_sqlite_in_its_volume():
    dockerfile = (DEPLOY / "Dockerfile").read_text()

    assert "HEALTHCHECK" in dockerfile and "/healthz" in dockerfile
    assert 'VOLUME ["/app/var"]' in dockerfile and "DATABASE_URL=sqlite:////app/var/db.sqlite3" in dockerfile
    assert "--proxy-headers" not in dockerfile
    assert (DEPLOY / "docker-entrypoint.sh").stat().st_mode & stat.S_IXUSR


@pytest.fixture
def stubbed_path(tmp_path):
    """A PATH whose ``python`` and ``daphne`` write their arguments to ``calls`` instead of running."""
    calls = tmp_path / "calls"
    for name in ("python", "daphne"):
        stub = tmp_path / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
        stub.chmod(0o755)
    return tmp_path, calls


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, ["python manage.py migrate --noinput", "daphne -b 0.0.0.0 -p 8000 completions_site.asgi:application"]),
        (
            {"MIGRATE_ON_START": "false", "DAPHNE_PROXY_HEADERS": "true"},
            ["daphne -b 0.0.0.0 -p 8000 --proxy-headers completions_site.asgi:application"],
        ),
    ],
)
def test_the_image_migrates_and_trusts_proxy_headers_only_when_told(stubbed_path, environment, expected):
    directory, calls = stubbed_path
    env = {"PATH": f"{directory}:/usr/bin:/bin", **environment}

    subprocess.run([str(DEPLOY / "docker-entrypoint.sh")], env=env, cwd=ROOT, check=True, timeout=30)

    assert calls.read_text().splitlines() == expected
