"""The API's paths skip the browser middleware; the admin keeps all of it (api/handlers.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from api.handlers import is_api_path, route
from testing.live_server import MODEL


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/completions", True),
        ("/v1/models/x", True),
        ("/v1/", True),
        ("/healthz", True),
        ("/v1", False),
        ("/healthz/", False),
        ("/healthzadmin", False),
        ("/admin/", False),
        ("/v1completions", False),
        ("/account/", False),
        ("/static/x.css", False),
        ("/", False),
    ],
)
def test_which_paths_the_api_handler_serves(path, api):
    assert is_api_path(path) is api


@pytest.mark.parametrize(
    ("path", "root_path", "served_by"),
    [
        ("/v1/completions", "", "api"),
        ("/api/v1/completions", "/api", "api"),
        # A script prefix (daphne takes it from a Daphne-Root-Path header) is not part of the routed path.
        ("/v1/admin/", "/v1", "site"),
        ("/healthz/admin/login/", "/healthz", "site"),
        ("/admin/", "", "site"),
    ],
)
def test_route_decides_on_the_path_django_routes_on(path, root_path, served_by):
    calls = []

    def app(name):
        async def application(scope, receive, send):
            calls.append(name)

        return application

    asyncio.run(route(app("api"), app("site"))({"type": "http", "path": path, "root_path": root_path}, None, None))
    assert calls == [served_by]


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


def test_the_admin_still_runs_the_full_middleware(server):
    response = httpx.get(server.base_url + "/admin/login/")
    assert response.status_code == 200
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "csrftoken" in response.cookies


def test_a_script_prefix_header_cannot_take_a_site_page_through_the_api_handler(server):
    response = httpx.get(server.base_url + "/v1/admin/", headers={"Daphne-Root-Path": "/v1"})
    assert response.status_code == 302  # the admin's login redirect: its middleware ran
    assert response.headers["X-Frame-Options"] == "DENY"


def test_a_host_outside_allowed_hosts_gets_a_json_400_on_the_api(server):
    response = httpx.get(server.api_url + "/models", headers={**server.headers(), "Host": "evil.example"})
    assert response.status_code == 400
    assert response.json() == {
        "error": {"message": "Invalid Host header.", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert httpx.get(server.base_url + "/healthz", headers={"Host": "evil.example"}).status_code == 400


@pytest.mark.parametrize(("path", "api"), [("/v1/usage/completions", True), ("/admin/", False)])
def test_django_refusals_before_any_view_are_openai_json_on_api_paths(path, api):
    from django.core.exceptions import TooManyFieldsSent
    from django.test import RequestFactory

    from api import views
    from completions_site import urls

    assert (urls.handler400, urls.handler500) == (views.bad_request, views.server_error)
    request = RequestFactory().get(path)
    refused = views.bad_request(request, TooManyFieldsSent("The number of GET/POST parameters exceeded 1000."))
    failed = views.server_error(request)
    assert (refused.status_code, failed.status_code) == (400, 500)
    if api:
        assert json.loads(refused.content)["error"] == {
            "message": "The number of GET/POST parameters exceeded 1000.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        assert json.loads(failed.content)["error"]["type"] == "server_error"
    else:
        assert refused["Content-Type"].startswith("text/html") and failed["Content-Type"].startswith("text/html")
