"""In a real browser, as a plain user: log in, create and revoke a key, see only one's own usage."""

from __future__ import annotations

import time

import httpx
import pytest

from testing.browser import PHONE, browser, create_users, issue_key, key_id, log_in, new_page, requires_browser
from testing.live_server import MODEL
from tests.completion_helpers import NO_EOS
from tests.usage_helpers import KEY_IN_TEXT

pytestmark = requires_browser  # e2e and browser: from the folder (tests/conftest.py)

ALICE = ("alice-browser", "alice-browser-pass-1")
BOB = ("bob-browser", "bob-browser-pass-1")


@pytest.fixture(scope="module")
def people(server):
    """Alice and Bob; Bob has a key he has used."""
    create_users(server, (*ALICE, False), (*BOB, False))
    bob_key = issue_key(server, BOB[0], "bob secret project")
    assert server.post({"model": MODEL, "prompt": "Hi", "max_tokens": 3}, key=bob_key).status_code == 200
    return {"bob_key": bob_key}


@pytest.fixture
def page(browser, server, people):
    page = new_page(browser, permissions=["clipboard-read", "clipboard-write"])
    log_in(page, server, *ALICE)
    yield page
    page.context.close()


def usage_by_key(server, key: str) -> dict[str, int]:
    """``{api_key_id: requests}`` over the last two days, from the usage API with ``key``."""
    params = {"start_time": int(time.time()) - 2 * 86400, "group_by": "api_key_id"}
    response = httpx.get(server.api_url + "/usage/completions", params=params, headers=server.headers(key))
    assert response.status_code == 200, response.text
    found: dict[str, int] = {}
    for bucket in response.json()["data"]:
        for result in bucket["results"]:
            found[result["api_key_id"]] = found.get(result["api_key_id"], 0) + result["num_model_requests"]
    return found


def test_a_user_creates_a_key_sees_it_once_copies_it_and_uses_it(page, server):
    assert page.url == server.base_url + "/account/"
    page.fill("#id_name", "browser laptop")
    page.click("#create-key-form [type=submit]")

    plaintext = page.input_value("#new-key")
    assert KEY_IN_TEXT.fullmatch(plaintext)
    page.click("button[data-copy]")
    assert page.evaluate("navigator.clipboard.readText()") == plaintext
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "logit_bias": NO_EOS}
    assert server.post(body, key=plaintext).status_code == 200

    page.goto(server.base_url + "/account/")
    assert plaintext not in page.content()
    row = page.locator("tr", has_text="browser laptop")
    assert f"sk-cs-{plaintext[6:14]}…" in row.inner_text()
    page.wait_for_function("() => window.Chart && Chart.getChart('chart-usage')")
    tokens = page.evaluate("Chart.getChart('chart-usage').data.datasets[1].data.reduce((a, b) => a + b, 0)")
    assert tokens >= 4  # this user's output tokens today
    assert "requests" in row.inner_text()


def test_a_user_revokes_a_key_and_it_stops_working(page, server):
    plaintext = issue_key(server, ALICE[0], "to revoke")
    page.goto(server.base_url + "/account/")
    page.locator("tr", has_text="to revoke").locator("a.revoke").click()
    page.click("#confirm-revoke")

    assert "Revoked" in page.locator(".messages").inner_text()
    assert "revoked" in page.locator("tr", has_text="to revoke").inner_text()
    assert httpx.get(server.api_url + "/models", headers=server.headers(plaintext)).status_code == 401


def test_a_user_never_sees_another_users_keys_or_usage(page, server, people):
    bob_key = people["bob_key"]
    page.goto(server.base_url + "/account/")
    content = page.content()
    assert "bob secret project" not in content and bob_key[6:14] not in content

    response = page.goto(server.base_url + f"/account/keys/{key_id(server, bob_key)}/revoke/")
    assert response.status == 404
    page.goto(server.base_url + "/admin/dashboard/")
    assert "/admin/login/" in page.url  # the dashboard is for staff only

    alice_key = issue_key(server, ALICE[0], "usage api")
    assert server.post({"model": MODEL, "prompt": "Hi", "max_tokens": 2}, key=alice_key).status_code == 200
    alices, bobs = usage_by_key(server, alice_key), usage_by_key(server, bob_key)
    assert alices.get(f"key_{alice_key[6:14]}") == 1
    assert f"key_{bob_key[6:14]}" not in alices and bobs.get(f"key_{bob_key[6:14]}", 0) >= 1
    assert not set(alices) & set(bobs)


def test_the_account_page_fits_a_phone(browser, server, people):
    page = new_page(browser, viewport=PHONE)
    log_in(page, server, *ALICE)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    page.context.close()
    assert overflow <= 0
