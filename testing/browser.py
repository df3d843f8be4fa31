"""Headless Chromium (Debian's package) driven by Playwright, against the live daphne server.

No browser is downloaded: Playwright launches ``/usr/bin/chromium`` (or ``$CHROMIUM``).  Where it
is missing the browser tests skip with the reason; ``.ci/install-browser`` installs it.

Playwright's sync API keeps an asyncio loop running in this thread while it is started, which
Django's ORM refuses to run beside; so the browser lives for one test module at a time, and the
browser tests reach the server's database only through ``manage.py`` and ``sqlite3``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.live_server import LiveServer

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}


def why_no_browser() -> str | None:
    """Why the browser tests cannot run here (``None`` when they can)."""
    if not Path(CHROMIUM).exists():
        return f"Chromium is not installed at {CHROMIUM} (apt-get install chromium, or .ci/install-browser)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


# For each browser test module's pytestmark: skip before any fixture (the live server) starts.
requires_browser = pytest.mark.skipif(why_no_browser() is not None, reason=why_no_browser() or "")


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """A started Playwright and its Chromium for a test module, or ``pytest.skip`` with the reason
    they cannot run."""
    reason = why_no_browser()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    finally:
        playwright.stop()


def new_page(browser, *, viewport: dict | None = None, **options):
    context = browser.new_context(viewport=viewport or LAPTOP, **options)
    page = context.new_page()
    page.set_default_timeout(20_000)
    return page


def create_users(server: LiveServer, *users: tuple[str, str, bool]) -> None:
    """Create ``(username, password, staff)`` users in the server's database, in one manage.py call."""
    lines = ["from django.contrib.auth.models import User"]
    for username, password, staff in users:
        create = "create_superuser" if staff else "create_user"
        lines.append(f"User.objects.{create}({username!r}, password={password!r})")
    server.manage("shell", "-c", "\n".join(lines))


def issue_key(server: LiveServer, username: str, name: str) -> str:
    return server.manage("create_api_key", "--name", name, "--user", username).strip().splitlines()[-1]


def key_id(server: LiveServer, plaintext: str) -> int:
    prefix = plaintext.removeprefix("sk-cs-").split(".")[0]
    with sqlite3.connect(server.database, timeout=20) as connection:
        return connection.execute("SELECT id FROM keys_apikey WHERE prefix = ?", (prefix,)).fetchone()[0]


def log_in(page, server: LiveServer, username: str, password: str, path: str = "/account/login/") -> None:
    page.goto(server.base_url + path)
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("[type=submit]")
    page.wait_for_load_state()
