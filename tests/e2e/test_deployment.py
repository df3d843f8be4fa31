"""The shipped deployment, tested: nginx (Debian's package) with ``deploy/nginx.conf`` in front of
two daphne processes on PostgreSQL and Redis.

Through nginx a stream arrives token by token, an oversized body is refused by nginx itself, the
dashboard's WebSocket upgrades, usage from both processes lands in one database and a limit holds
across both.  Skipped where nginx is not installed (``.ci/install-nginx``) or PostgreSQL or Redis
does not answer; CI's second pass has all three.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from testing.live_server import MODEL, LiveServer, _manage, free_port, start_server, stop_server
from testing.nginx import Nginx, nginx_binary, start_nginx
from testing.postgres import POSTGRES_URL, postgres_reachable, scratch_database
from tests.conftest import TEST_REDIS_URL, redis_reachable

NO_EOS = {"0": -100, "2": -100}  # neither end-of-text token: a request makes exactly max_tokens
MAX_BODY_BYTES = 65536


class Deployment:
    """nginx and the two servers behind it, on one database."""

    def __init__(self, nginx: Nginx, servers: list[LiveServer], database_url: str) -> None:
        self.nginx, self.servers, self.database_url = nginx, servers, database_url
        self.key = servers[0].key

    def post(self, body: dict, *, key: str | None = None, **kwargs) -> httpx.Response:
        return httpx.post(
            self.nginx.base_url + "/v1/completions",
            json={"model": MODEL, **body},
            headers={"Authorization": f"Bearer {key or self.key}"},
            timeout=120,
            **kwargs,
        )

    def query(self, sql: str, *params) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.database_url) as connection:
            return connection.execute(sql, params).fetchall()

    def upstream_addresses(self) -> set[str]:
        return {server.base_url.removeprefix("http://") for server in self.servers}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (.ci/install-nginx)")
    if not postgres_reachable(POSTGRES_URL):
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_URL} (set E2E_POSTGRES_URL)")
    if not redis_reachable(TEST_REDIS_URL):
        pytest.skip(f"Redis is not reachable at {TEST_REDIS_URL} (set REDIS_URL)")
    with scratch_database("completions_deploy") as database_url:
        yield from _deployment(tmp_path_factory, database_url)


def _deployment(tmp_path_factory, database_url: str) -> Iterator[Deployment]:
    settings = {
        "REDIS_URL": TEST_REDIS_URL,
        "API_LIMITS_REDIS_PREFIX": f"completions-site-e2e:{uuid.uuid4().hex[:12]}:",
        "API_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        "ENGINE_NUM_THREADS": "1",
        "LOG_LEVEL": "WARNING",
        "proxy_headers": True,  # as the shipped units and image run them behind nginx
    }
    servers: list[LiveServer] = []
    nginx = None
    try:
        servers.append(start_server(tmp_path_factory.mktemp("first"), database_url=database_url, **settings))
        servers.append(
            start_server(tmp_path_factory.mktemp("second"), database_url=database_url, key=servers[0].key, **settings)
        )
        _manage(
            servers[0].env,
            "shell",
            "-v",
            "0",
            "-c",
            "from django.contrib.auth.models import User; User.objects.create_superuser('ops', '', 'ops-password-1')",
        )
        upstreams = [server.base_url.removeprefix("http://") for server in servers]
        nginx = start_nginx(tmp_path_factory.mktemp("nginx"), upstreams, MAX_BODY_BYTES)
        yield Deployment(nginx, servers, database_url)
    finally:
        if nginx is not None:
            nginx.stop()
        for server in servers:
            stop_server(server)


def test_a_stream_flows_through_nginx_token_by_token(deployment):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 48, "stream": True, "logit_bias": NO_EOS}
    arrivals: list[float] = []
    lines: list[str] = []
    with httpx.stream(
        "POST",
        deployment.nginx.base_url + "/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {deployment.key}"},
        timeout=120,
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                lines.append(line)
                arrivals.append(time.monotonic())
    # Up to 48 text chunks (a token whose text ends inside a UTF-8 character goes out with the next
    # one), then [DONE]; buffered by the proxy, they would all arrive at once, at the end.
    assert lines[-1] == "data: [DONE]" and len(lines) >= 40
    assert arrivals[-1] - arrivals[0] > 0.2
    assert len({round(t, 2) for t in arrivals}) > 10  # in many separate arrivals


def completions_served(server: LiveServer) -> float:
    """How many /v1/completions requests ``server`` has answered, from its own /metrics (read
    directly, from the loopback): what reached daphne, whatever the log level."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "completions_http_requests_total" and sample.labels.get("endpoint") == "/v1/completions"
    )


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_oversized_body_gets_nginx_413_and_never_reaches_daphne(deployment, framing):
    before = [completions_served(server) for server in deployment.servers]
    logged = len(deployment.nginx.upstreams())
    body = json.dumps({"model": MODEL, "prompt": "x" * MAX_BODY_BYTES}).encode()
    # Chunked: no Content-Length, so nginx learns the size only as the body arrives.
    content = body if framing == "content-length" else iter([body[i : i + 8192] for i in range(0, len(body), 8192)])

    response = httpx.post(
        deployment.nginx.base_url + "/v1/completions",
        content=content,
        timeout=30,
        headers={"Authorization": f"Bearer {deployment.key}", "Content-Type": "application/json"},
    )

    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert "x-request-id" not in response.headers  # every answer of ours has one
    assert deployment.nginx.logged_after(logged, 1) == [(413, "POST", "/v1/completions", "-")]
    assert [completions_served(server) for server in deployment.servers] == before


def test_https_serves_the_same_site_with_the_certificate_by_path(deployment):
    response = httpx.get(deployment.nginx.tls_url + "/healthz", verify=False, timeout=30)

    assert response.status_code == 200
    assert response.http_version == "HTTP/1.1"
    models = httpx.get(
        deployment.nginx.tls_url + "/v1/models", headers={"Authorization": f"Bearer {deployment.key}"}, verify=False
    )
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL


def test_nginx_renders_and_serves_tls_before_any_server_answers(tmp_path):
    if nginx_binary() is None:
        pytest.skip("nginx is not installed (.ci/install-nginx)")
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens there: nginx answers 502 itself
    nginx = start_nginx(tmp_path, [nobody], MAX_BODY_BYTES)
    try:
        assert httpx.get(nginx.tls_url + "/healthz", verify=False, timeout=30).status_code == 502
        assert httpx.get(nginx.tls_url + "/metrics", verify=False, timeout=30).status_code == 404
        with pytest.raises(httpx.ConnectError):  # the certificate is self-signed: checked, refused
            httpx.get(nginx.tls_url + "/healthz", timeout=30)
    finally:
        nginx.stop()


@pytest.mark.parametrize("forwarded_for", [None, "127.0.0.1", "::1, 127.0.0.1"])
def test_metrics_are_not_served_through_nginx_whatever_x_forwarded_for_says(deployment, forwarded_for):
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}

    response = httpx.get(deployment.nginx.base_url + "/metrics", headers=headers, timeout=30)

    assert response.status_code == 404
    assert b"completions_" not in response.content


def test_the_dashboards_websocket_connects_through_nginx(deployment):
    with httpx.Client(base_url=deployment.nginx.base_url, timeout=30) as browser:
        login = browser.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)[1]
        browser.post(
            "/admin/login/",
            data={"username": "ops", "password": "ops-password-1", "csrfmiddlewaretoken": token, "next": "/admin/"},
        )
        session = browser.cookies["sessionid"]
    host = deployment.nginx.base_url.removeprefix("http://")
    address, port = host.split(":")
    with socket.create_connection((address, int(port)), timeout=15) as connection:
        connection.sendall(
            (
                f"GET /ws/admin/engine/ HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n"
                f"Origin: http://{host}\r\nCookie: sessionid={session}\r\n\r\n"
            ).encode()
        )
        received = b""
        while b'"type": "engine"' not in received and b'"type":"engine"' not in received:
            chunk = connection.recv(4096)
            assert chunk, received
            received += chunk
    assert received.startswith(b"HTTP/1.1 101 "), received[:200]


def test_usage_from_both_processes_lands_in_one_database(deployment):
    logged = len(deployment.nginx.upstreams())
    replies = [deployment.post({"prompt": f"Item {i}", "max_tokens": 2}) for i in range(6)]

    assert [r.status_code for r in replies] == [200] * 6
    ids = {r.headers["x-request-id"] for r in replies}
    served = {row[3] for row in deployment.nginx.logged_after(logged, 6)}
    assert served == deployment.upstream_addresses()
    deadline = time.monotonic() + 10
    while True:
        found = {
            row[0]
            for row in deployment.query("SELECT request_id FROM keys_usagerecord WHERE request_id = ANY(%s)", list(ids))
        }
        if found == ids or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert found == ids


def test_a_requests_limit_holds_across_both_processes_behind_nginx(deployment):
    key = (
        deployment.servers[0]
        .manage("create_api_key", "--name", "rpm6", "--user", "e2e", "--rpm", "6")
        .strip()
        .splitlines()[-1]
    )

    logged = len(deployment.nginx.upstreams())
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda i: deployment.post({"prompt": "Hi", "max_tokens": 1}, key=key), range(14)))

    assert Counter(r.status_code for r in replies) == {200: 6, 429: 8}
    assert all(r.json()["error"]["type"] == "requests" for r in replies if r.status_code == 429)
    assert all("retry-after" in r.headers for r in replies if r.status_code == 429)
    served = {row[3] for row in deployment.nginx.logged_after(logged, 14) if row[0] == 200}
    assert served == deployment.upstream_addresses()
