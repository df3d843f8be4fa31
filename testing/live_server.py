"""A real daphne server with the real embedded model, started once per test session.

The server runs in a subprocess on a free port with its own SQLite database file (the test
database of pytest-django is in memory, out of another process's reach).  Tests call it over
HTTP with the official ``openai`` client or raw HTTP, and read its usage records straight from
that database file.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
# One key for every server of the session (servers sharing a database read each other's sessions):
# debug is off, as in production, and a server with debug off refuses the default key.
SECRET_KEY = secrets.token_urlsafe(50)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveServer:
    """A running server: its ``base_url``, a working ``key``, and its database for usage records."""

    base_url: str
    key: str
    database: Path
    process: subprocess.Popen
    log: Path
    env: dict = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def post(self, body: dict | bytes, *, key: str | None = None, timeout: float = 120, **kwargs) -> httpx.Response:
        """``POST /v1/completions`` with raw ``httpx``; ``body`` as JSON or raw bytes."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {**self.headers(key), "Content-Type": "application/json", **kwargs.pop("headers", {})}
        return httpx.post(self.api_url + "/completions", content=content, headers=headers, timeout=timeout, **kwargs)

    def usage(self, request_id: str, wait: float = 10.0) -> dict | None:
        """The usage record of ``request_id`` as a dict, waiting up to ``wait`` s for it to be written."""
        deadline = time.monotonic() + wait
        while True:
            with sqlite3.connect(self.database, timeout=20) as connection:
                connection.row_factory = sqlite3.Row
                row = connection.execute(
                    "SELECT * FROM keys_usagerecord WHERE request_id = ?", (request_id,)
                ).fetchone()
            if row is not None or time.monotonic() > deadline:
                return dict(row) if row is not None else None
            time.sleep(0.1)

    def usage_count(self) -> int:
        with sqlite3.connect(self.database, timeout=20) as connection:
            return connection.execute("SELECT COUNT(*) FROM keys_usagerecord").fetchone()[0]

    def manage(self, *args: str) -> str:
        """Run ``manage.py`` against the server's database; returns its stdout."""
        return _manage(self.env, *args)

    def alive(self) -> bool:
        return self.process.poll() is None


def _manage(env: dict, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def start_server(
    directory: Path,
    *,
    database_url: str | None = None,
    key: str | None = None,
    proxy_headers: bool = False,
    **settings: str,
) -> LiveServer:
    """Start daphne on ``directory``'s SQLite file (or ``database_url``) and wait for ``/healthz``.

    Without ``key`` the database is new: it is migrated and gets a user and a key.  With one, the
    server joins a database that another server prepared.  Each server counts limits under a Redis
    prefix of its own (when ``REDIS_URL`` is set) unless ``API_LIMITS_REDIS_PREFIX`` is given.
    ``MODEL_WEIGHTS`` is ``float32`` unless the environment or ``settings`` name another: ``auto``
    may plan int4 for one or two rows and another format above, so the same request's logprobs
    would turn on when its prompts join the batch (the formats are tested in tests/unit).
    ``proxy_headers`` runs daphne with ``--proxy-headers``, as the shipped units do behind nginx.
    """
    database = directory / "server.sqlite3"
    port = free_port()
    env = {
        "MODEL_WEIGHTS": "float32",
        "DJANGO_SECRET_KEY": SECRET_KEY,
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "completions_site.settings",
        "DATABASE_URL": database_url or f"sqlite:///{database}",
        "API_LIMITS_REDIS_PREFIX": f"completions-site-e2e:{uuid.uuid4().hex[:12]}:",
        "USAGE_JOURNAL_DIR": str(directory / "journal"),
        "PYTHONUNBUFFERED": "1",
        **settings,
    }
    if key is None:
        _manage(env, "migrate", "--noinput", "-v", "0")
        _manage(env, "shell", "-c", "from django.contrib.auth.models import User; User.objects.create_user('e2e')")
        key = _manage(env, "create_api_key", "--name", "e2e", "--user", "e2e").strip().splitlines()[-1]
    log = directory / "daphne.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            *(["--proxy-headers"] if proxy_headers else []),
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "completions_site.asgi:application",
        ],
        env=env,
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = LiveServer(f"http://127.0.0.1:{port}", key, database, process, log, env)
    try:
        wait_healthy(process, server.base_url, log)
    except RuntimeError:
        stop_server(server)
        raise
    return server


def wait_healthy(process: subprocess.Popen, base_url: str, log: Path, timeout: float = 600) -> None:
    """Wait until ``base_url/healthz`` answers 200, long enough for a first start's GGUF conversion.

    That conversion's time: docs/performance.md#the-autotunes-noise-and-the-ggufs-blocks.

    Raises ``RuntimeError`` with the log's tail if the process exits or ``timeout`` seconds pass.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base_url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the server did not become healthy:\n{log.read_text()[-3000:]}")


def stop_server(server: LiveServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
    forget_limit_counters(server.env.get("REDIS_URL"), server.env.get("API_LIMITS_REDIS_PREFIX"))


def forget_limit_counters(url: str | None, prefix: str | None) -> None:
    """Delete the limit counters under ``prefix`` from the Redis at ``url`` (a month's counter would
    stay 40 days); nothing without both, or when Redis is gone."""
    if not url or not prefix:
        return
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5)
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    except (redis.RedisError, OSError):
        pass  # Redis went away first: nothing to tidy


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> LiveServer:
    """The default configuration (bfloat16 on this CPU), shared by the whole session."""
    live = start_server(tmp_path_factory.mktemp("server"))
    yield live
    stop_server(live)


@pytest.fixture(scope="session")
def openai_client(server):
    """The official ``openai`` client pointed at the live server, without retries."""
    from openai import OpenAI

    return OpenAI(base_url=server.api_url, api_key=server.key, max_retries=0, timeout=120)
