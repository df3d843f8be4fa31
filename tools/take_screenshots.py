"""Screenshots of the staff dashboard and a user's account page for the docs (``docs/*.png``).

Usage (from the repository root, with Chromium installed: ``.ci/install-browser``)::

    .venv/bin/python tools/take_screenshots.py [--out docs]

It starts a throwaway server with the real model on a temporary database, creates an admin and two
users, makes real completions with their keys, then adds 30 days of made-up history (usage records
with ids ``demo-...``) so that the charts show more than today, and photographs the pages in
headless Chromium.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.browser import CHROMIUM, CHROMIUM_ARGS, PHONE, create_users, issue_key, log_in  # noqa: E402
from testing.live_server import MODEL, start_server, stop_server  # noqa: E402

ADMIN = ("admin", "screenshot-admin-1")
ALICE = ("alice", "screenshot-alice-1")
BOB = ("bob", "screenshot-bob-1")

# 30 days of plausible history for the demo users' keys, deterministic so that reruns match.
HISTORY = """
import random
from datetime import timedelta
from django.utils import timezone
from keys.models import APIKey, UsageRecord
random.seed(6)
now = timezone.now()
rows = []
keys = list(APIKey.objects.filter(owner__username__in=["alice", "bob"], revoked_at__isnull=True))
for hour in range(1, 30 * 24):
    at = now - timedelta(hours=hour)
    busy = 3 if 8 <= at.hour <= 18 else 1
    for n in range(random.randint(0, 3 * busy)):
        key = random.choice(keys)
        prompt, completion = random.randint(20, 400), random.randint(10, 250)
        status = random.choices([200, 429, 400, 500], [92, 4, 3, 1])[0]
        if status != 200:
            completion = 0
        latency = 40 + completion * random.uniform(18, 30)
        rows.append(UsageRecord(api_key=key, owner_id=key.owner_id, model="smollm2-135m-instruct",
            request_id=f"demo-{hour}-{n}", prompt_tokens=prompt, completion_tokens=completion,
            total_tokens=prompt + completion, status_code=status, latency_ms=latency,
            time_to_first_token_ms=random.uniform(25, 90) if status == 200 else None,
            created_at=at - timedelta(minutes=random.randint(0, 59))))
UsageRecord.objects.bulk_create(rows)
print(len(rows))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as directory:
        server = start_server(Path(directory))
        try:
            create_users(server, (*ADMIN, True), (*ALICE, False), (*BOB, False))
            keys = [
                issue_key(server, "alice", "laptop"),
                issue_key(server, "alice", "ci"),
                issue_key(server, "bob", "server"),
            ]
            for index, key in enumerate(keys * 2):
                server.post(
                    {"model": MODEL, "prompt": "Write a haiku about the sea.", "max_tokens": 8 + 4 * index}, key=key
                )
            server.manage("shell", "-c", HISTORY)
            args.out.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                shoot(
                    browser,
                    server,
                    ADMIN,
                    "/admin/dashboard/",
                    args.out / "dashboard.png",
                    {"width": 1280, "height": 900},
                )
                shoot(browser, server, ALICE, "/account/", args.out / "account.png", {"width": 1100, "height": 900})
                shoot(browser, server, ALICE, "/account/", args.out / "account-phone.png", PHONE)
                browser.close()
        finally:
            stop_server(server)
    return 0


def shoot(browser, server, who: tuple[str, str], path: str, out: Path, viewport: dict) -> None:
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    login = "/admin/login/?next=/admin/" if path.startswith("/admin/") else "/account/login/"
    log_in(page, server, *who, path=login)
    page.goto(server.base_url + path)
    page.wait_for_function("() => window.Chart && document.querySelectorAll('canvas[data-chart]').length > 0")
    if path.startswith("/admin/dashboard/"):
        page.wait_for_function("() => Number(document.getElementById('live').dataset.updates) >= 1")
    page.screenshot(path=str(out), full_page=viewport is not PHONE)  # a phone: its first screen
    context.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
