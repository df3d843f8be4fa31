"""In a real browser, as staff: the admin's key creation, the dashboard's charts and its live figures."""

from __future__ import annotations

import threading

import httpx
import pytest

from testing.browser import browser, create_users, log_in, new_page, requires_browser
from testing.live_server import MODEL
from tests.completion_helpers import NO_EOS
from tests.usage_helpers import KEY_IN_TEXT

pytestmark = requires_browser  # e2e and browser: from the folder (tests/conftest.py)

STAFF = ("sam-browser", "sam-browser-pass-1")


@pytest.fixture(scope="module")
def staff(server):
    create_users(server, (*STAFF, True))
    return STAFF


@pytest.fixture
def admin_page(browser, server, staff):
    page = new_page(browser)
    log_in(page, server, *staff, path="/admin/login/?next=/admin/")
    yield page
    page.context.close()


def test_staff_create_a_key_in_the_admin_and_see_it_exactly_once(admin_page, server):
    admin_page.goto(server.base_url + "/admin/keys/apikey/add/")
    admin_page.fill("#id_name", "made in a browser")
    admin_page.click("input[name=_save]")

    shown = KEY_IN_TEXT.findall(admin_page.locator(".messagelist").inner_text())
    assert len(shown) == 1
    assert httpx.get(server.api_url + "/models", headers=server.headers(shown[0])).status_code == 200
    for path in ("/admin/keys/apikey/", "/admin/"):
        admin_page.goto(server.base_url + path)
        assert shown[0] not in admin_page.content()


def test_the_dashboard_draws_charts_with_the_real_completions(admin_page, server):
    for max_tokens in (3, 4):
        assert (
            server.post({"model": MODEL, "prompt": "Hello", "max_tokens": max_tokens, "logit_bias": NO_EOS}).status_code
            == 200
        )
    server.post({"model": MODEL, "prompt": "Hello", "temperature": 9})  # a 400, counted as an error

    admin_page.goto(server.base_url + "/admin/")
    admin_page.click("text=Usage dashboard")
    admin_page.wait_for_function(
        "() => window.Chart && Chart.getChart('chart-hourly') && Chart.getChart('chart-daily')"
    )

    for chart in ("chart-hourly", "chart-daily"):
        sums = admin_page.evaluate(
            """(id) => Object.fromEntries(Chart.getChart(id).data.datasets.map(
                   (d) => [d.label, d.data.reduce((a, b) => a + b, 0)]))""",
            chart,
        )
        assert sums["Requests"] >= 3 and sums["Input tokens"] > 0 and sums["Output tokens"] >= 7 and sums["Errors"] >= 1
        assert _painted_pixels(admin_page, chart, (79, 127, 217)) > 20  # the input-token bars are drawn
    assert int(admin_page.inner_text("#total-requests").replace(",", "")) >= 3

    export = admin_page.request.get(server.base_url + admin_page.locator("#export-csv").get_attribute("href"))
    lines = export.text().splitlines()
    assert export.status == 200 and export.headers["content-type"].startswith("text/csv")
    assert lines[0].startswith("created_at,request_id,username,api_key_prefix") and len(lines) >= 4


def test_a_live_figure_changes_over_the_websocket_while_a_completion_runs(admin_page, server):
    admin_page.goto(server.base_url + "/admin/dashboard/")
    admin_page.wait_for_function("() => Number(document.getElementById('live').dataset.updates) >= 1")
    assert admin_page.inner_text("#live-running") == "0"

    # A long stream, read until the page has seen it; then the client hangs up (the server aborts it).
    body = {"model": MODEL, "prompt": "Tell a long story.", "max_tokens": 400, "logit_bias": NO_EOS, "stream": True}
    seen = threading.Event()
    worker = threading.Thread(target=_stream_until, args=(server, body, seen))
    worker.start()
    try:
        admin_page.wait_for_function(
            "() => Number(document.getElementById('live-running').textContent) >= 1", timeout=120_000
        )
        admin_page.wait_for_function(
            "() => Number(document.getElementById('live-tps').textContent) > 0", timeout=120_000
        )
    finally:
        seen.set()
        worker.join(timeout=120)
    # The ended request arrives as a usage event, and the engine goes back to idle.
    admin_page.wait_for_function(
        "() => Number(document.getElementById('live-requests').textContent) >= 1", timeout=60_000
    )
    assert int(admin_page.inner_text("#live-tokens")) >= 1
    admin_page.wait_for_function("() => document.getElementById('live-running').textContent === '0'", timeout=60_000)


def _stream_until(server, body: dict, stop: threading.Event) -> None:
    with httpx.stream(
        "POST", server.api_url + "/completions", json=body, headers=server.headers(), timeout=300
    ) as response:
        for _ in response.iter_lines():
            if stop.is_set():
                return


def _painted_pixels(page, canvas_id: str, rgb: tuple[int, int, int]) -> int:
    """How many pixels of ``canvas_id`` have colour ``rgb`` (within a small tolerance)."""
    return page.evaluate(
        """([id, rgb]) => {
            const canvas = document.getElementById(id);
            const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            let count = 0;
            for (let i = 0; i < pixels.length; i += 4) {
                if (Math.abs(pixels[i] - rgb[0]) < 8 && Math.abs(pixels[i + 1] - rgb[1]) < 8 &&
                    Math.abs(pixels[i + 2] - rgb[2]) < 8 && pixels[i + 3] > 200) count++;
            }
            return count;
        }""",
        [canvas_id, list(rgb)],
    )
