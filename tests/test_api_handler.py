"""The API's paths skip the browser middleware; the admin keeps all of it (completions_site/handlers.py)."""
from __future__ import annotations

import httpx
import pytest

from completions_site.handlers import is_api_path
from tests.live_server import MODEL


@pytest.mark.parametrize(
    ("path", "api"),
    [("/v1", True), ("/v1/completions", True), ("/v1/models/x", True), ("/healthz", True),
     ("/admin/", False), ("/v1completions", False), ("/account/", False), ("/static/x.css", False), ("/", False)],
)
def test_which_paths_the_api_handler_serves(path, api):
    assert is_api_path(path) is api


@pytest.mark.e2e
def test_api_answers_carry_no_browser_middleware_headers(server):
    response = server.post({"model": MODEL, "prompt": "Hi", "max_tokens": 1})
    assert response.status_code == 200
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    # XFrameOptionsMiddleware, SessionMiddleware/CsrfViewMiddleware (Vary: Cookie) did not run.
    assert "X-Frame-Options" not in response.headers
    assert "Cookie" not in response.headers.get("Vary", "")
    missing = httpx.get(server.api_url + "/nothing-here", headers=server.headers())
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "Invalid URL (GET /v1/nothing-here)"
    assert "X-Frame-Options" not in missing.headers


@pytest.mark.e2e
def test_the_admin_still_runs_the_full_middleware(server):
    response = httpx.get(server.base_url + "/admin/login/")
    assert response.status_code == 200
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "csrftoken" in response.cookies
