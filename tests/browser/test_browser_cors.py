"""In a real browser, a page on another origin calls the API: allowed where API_CORS_ALLOWED_ORIGINS
names its origin (the preflight and the call answered with its CORS headers), blocked by the
browser for any other origin."""

from __future__ import annotations

import http.server
import socketserver
import threading

import pytest

from testing.browser import browser, new_page, requires_browser  # browser: a fixture
from testing.live_server import MODEL, free_port, start_server, stop_server

pytestmark = requires_browser  # e2e and browser: from the folder (tests/conftest.py)


def serve_page() -> tuple[socketserver.TCPServer, str]:
    """An empty page on another origin than the API's: a port of its own on 127.0.0.1."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><title>another site</title>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    port = free_port()
    httpd = socketserver.TCPServer(("127.0.0.1", port), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def pages():
    allowed, refused = serve_page(), serve_page()
    yield allowed[1], refused[1]
    for httpd, _ in (allowed, refused):
        httpd.shutdown()


@pytest.fixture(scope="module")
def cors_server(tmp_path_factory, pages):
    live = start_server(tmp_path_factory.mktemp("cors"), API_CORS_ALLOWED_ORIGINS=pages[0])
    yield live
    stop_server(live)


# A JSON POST with an Authorization header: the browser sends a preflight first.
CALL = """async ([url, key, model]) => {
    try {
        const response = await fetch(url, {method: "POST", headers: {"Authorization": "Bearer " + key,
            "Content-Type": "application/json"}, body: JSON.stringify({model, prompt: "Hi", max_tokens: 2})});
        const body = await response.json();
        return {status: response.status, object: body.object};
    } catch (error) {
        return {error: String(error)};
    }
}"""


def test_a_page_on_an_allowed_origin_calls_the_api_and_another_origin_is_blocked(browser, cors_server, pages):
    allowed, refused = pages
    url = cors_server.api_url + "/completions"
    for origin, expected in ((allowed, {"status": 200, "object": "text_completion"}), (refused, None)):
        page = new_page(browser)
        try:
            page.goto(origin + "/")
            got = page.evaluate(CALL, [url, cors_server.key, MODEL])
        finally:
            page.context.close()
        if expected is None:
            assert "error" in got  # the browser refused the response: no Access-Control-Allow-Origin for it
        else:
            assert got == expected
