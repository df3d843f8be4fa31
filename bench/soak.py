"""Soak test (issue 15): mixed load for N minutes on the shipped deployment, checking what must hold.

    .venv/bin/python bench/soak.py                    # 10 minutes
    .venv/bin/python bench/soak.py --minutes 3 --concurrency 6 --json soak.json

Two daphne processes on PostgreSQL and Redis (a database of its own, created from the ``test``
database at ``E2E_POSTGRES_URL`` and dropped afterwards; ``REDIS_URL``), nginx from Debian's package
in front with ``deploy/nginx.conf`` (``testing/nginx.py``).  ``--concurrency`` clients send, for
the whole time, a mix of: streams read to the end, short non-streamed requests, streams the client
leaves after the first event, bad requests (a 400 after authentication), and requests with a
key limited to a few requests a minute (mostly 429s).

It prints the requests sent and the usage records written (every request here authenticates, so
they must be equal), the 5xx count (must be 0), each process's resident memory (RSS) after
warm-up and at the end, and, where the servers serve ``/metrics``, its request totals beside the
client's.  Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from testing.live_server import MODEL, LiveServer, _manage, start_server, stop_server
from testing.nginx import Nginx, nginx_binary, start_nginx
from testing.postgres import POSTGRES_URL, scratch_database

REDIS_URL = "redis://127.0.0.1:6379/0"
KINDS = {"stream": 35, "short": 30, "disconnect": 10, "bad": 10, "limited": 15}  # weights


class Tally:
    """What the clients saw: requests sent by kind, statuses, and transport failures."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.transport_errors: Counter[str] = Counter()
        self.five_xx: list[str] = []

    def answered(self, kind: str, response: httpx.Response) -> None:
        self.statuses[response.status_code] += 1
        if response.status_code >= 500:
            self.five_xx.append(f"{kind} {response.status_code} {response.headers.get('x-request-id', '')}")


async def one_request(client: httpx.AsyncClient, base_url: str, keys: dict[str, str], kind: str, tally: Tally) -> None:
    """Send one request of ``kind`` and tally it."""
    key = keys["limited" if kind == "limited" else "main"]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    url = base_url + "/v1/completions"
    body = {
        "model": MODEL,
        "prompt": f"Story {random.randrange(10**6)}: once upon a time",
        "max_tokens": random.randint(4, 32),
    }
    tally.sent[kind] += 1
    try:
        if kind in ("stream", "disconnect"):
            body["stream"] = True
            async with client.stream("POST", url, json=body, headers=headers) as response:
                tally.answered(kind, response)
                async for line in response.aiter_lines():
                    if kind == "disconnect" and line.startswith("data: {"):
                        break  # the client leaves mid-stream
            return
        content = b'{"model": "' + MODEL.encode() + b'", "prompt": ' if kind == "bad" else json.dumps(body).encode()
        response = await client.post(url, content=content, headers=headers)
        tally.answered(kind, response)
    except httpx.HTTPError as error:
        tally.transport_errors[type(error).__name__] += 1


async def clients(base_url: str, keys: dict[str, str], concurrency: int, seconds: float, tally: Tally) -> None:
    """``concurrency`` clients sending random kinds of request until ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    kinds, weights = list(KINDS), list(KINDS.values())

    async def client_loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            await one_request(client, base_url, keys, random.choices(kinds, weights)[0], tally)

    async def progress() -> None:
        started = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(30)
            print(
                f"  {time.monotonic() - started:5.0f} s: {sum(tally.sent.values())} sent, statuses {dict(tally.statuses)}",
                flush=True,
            )

    async with httpx.AsyncClient(timeout=120) as client:
        reporter = asyncio.create_task(progress())
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        reporter.cancel()


def rss_mb(server: LiveServer) -> float:
    import psutil

    return psutil.Process(server.process.pid).memory_info().rss / 2**20


def metrics_totals(server: LiveServer) -> dict[str, float] | None:
    """Sums of the ``*requests*_total`` counters in the server's ``/metrics``; ``None`` without one."""
    try:
        response = httpx.get(server.base_url + "/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    totals: Counter[str] = Counter()
    for line in response.text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+([-+\deE.na]+)$", line)
        if match and "request" in match[1] and match[1].endswith("_total"):
            totals[match[1]] += float(match[3])
    return dict(totals)


def completions_counted(server: LiveServer) -> float | None:
    """``completions_http_requests_total{endpoint="/v1/completions"}`` summed over status classes:
    the requests ``server`` answered there (each process answers for itself here); ``None`` without /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = httpx.get(server.base_url + "/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return sum(
        sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "completions_http_requests_total" and sample.labels.get("endpoint") == "/v1/completions"
    )


def usage_records(database_url: str) -> int:
    import psycopg

    with psycopg.connect(database_url) as connection:
        return connection.execute("SELECT count(*) FROM keys_usagerecord").fetchone()[0]


def wait_for_records(database_url: str, expected: int, timeout: float = 60) -> int:
    """The usage records' count once it reaches ``expected`` or stops moving for 3 s."""
    deadline, last, stable_since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        count = usage_records(database_url)
        if count >= expected:
            return count
        if count != last:
            last, stable_since = count, time.monotonic()
        elif time.monotonic() - stable_since > 3:
            return count
        time.sleep(0.5)
    return usage_records(database_url)


def run(args: argparse.Namespace, workdir: Path) -> dict:
    with scratch_database("completions_soak", args.postgres) as database_url:
        return _run(args, workdir, database_url)


def _run(args: argparse.Namespace, workdir: Path, database_url: str) -> dict:
    settings = {
        "REDIS_URL": args.redis,
        "API_LIMITS_REDIS_PREFIX": f"completions-site-soak:{uuid.uuid4().hex[:12]}:",
        "ENGINE_NUM_THREADS": str(args.threads),
        "LOG_LEVEL": "WARNING",
    }
    servers: list[LiveServer] = []
    nginx: Nginx | None = None
    for folder in ("first", "second"):
        (workdir / folder).mkdir()
    try:
        servers.append(start_server(workdir / "first", database_url=database_url, **settings))
        servers.append(start_server(workdir / "second", database_url=database_url, key=servers[0].key, **settings))
        limited = _manage(
            servers[0].env, "create_api_key", "--name", "limited", "--user", "e2e", "--rpm", str(args.limited_rpm)
        )
        keys = {"main": servers[0].key, "limited": limited.strip().splitlines()[-1]}
        nginx = start_nginx(workdir / "nginx", [s.base_url.removeprefix("http://") for s in servers], 4 * 1024 * 1024)
        rss_start = [rss_mb(server) for server in servers]
        print(
            f"soak: {args.minutes} min, {args.concurrency} clients, through {nginx.base_url}; RSS at start "
            f"{', '.join(f'{mb:.0f} MB' for mb in rss_start)}",
            flush=True,
        )

        tally = Tally()
        started = time.monotonic()
        asyncio.run(clients(nginx.base_url, keys, args.concurrency, args.minutes * 60, tally))
        elapsed = time.monotonic() - started
        sent = sum(tally.sent.values())
        records = wait_for_records(database_url, sent)
        rss_end = [rss_mb(server) for server in servers]
        metrics = [metrics_totals(server) for server in servers]
        counted = [completions_counted(server) for server in servers]
        errors = "\n".join(
            line
            for s in servers
            for line in s.log.read_text().splitlines()
            if "Could not record usage" in line or "Traceback" in line
        )
        return {
            "minutes": round(elapsed / 60, 2),
            "concurrency": args.concurrency,
            "requests_sent": sent,
            "by_kind": dict(tally.sent),
            "statuses": dict(sorted(tally.statuses.items())),
            "transport_errors": dict(tally.transport_errors),
            "usage_records": records,
            "five_xx": len(tally.five_xx),
            "five_xx_examples": tally.five_xx[:5],
            "rss_mb_start": [round(mb) for mb in rss_start],
            "rss_mb_end": [round(mb) for mb in rss_end],
            "metrics": metrics if any(m is not None for m in metrics) else None,
            "metrics_completions": None if None in counted else sum(counted),
            "server_log_errors": errors[-2000:],
        }
    finally:
        if nginx is not None:
            nginx.stop()
        for server in servers:
            stop_server(server)


def report(result: dict) -> bool:
    """Print the figures and the checks; returns whether they all hold."""
    print(f"requests sent        {result['requests_sent']} in {result['minutes']} min  {result['by_kind']}")
    print(f"statuses             {result['statuses']}  transport errors {result['transport_errors']}")
    print(f"usage records        {result['usage_records']}")
    print(f"5xx                  {result['five_xx']}  {result['five_xx_examples']}")
    for index, (start, end) in enumerate(zip(result["rss_mb_start"], result["rss_mb_end"])):
        print(f"RSS process {index + 1}        {start} MB -> {end} MB")
    if result["metrics"] is None:
        print("/metrics             not served (404): skipped")
    else:
        totals: Counter[str] = Counter()
        for per_process in result["metrics"]:
            totals.update(per_process or {})
        print(f"/metrics totals      {dict(totals)}  (client: {result['requests_sent']} requests)")
    if result["server_log_errors"]:
        print("server log errors:\n" + result["server_log_errors"])
    checks = {
        "usage records == requests sent": result["usage_records"] == result["requests_sent"],
        "no 5xx": result["five_xx"] == 0,
        "no transport errors": not result["transport_errors"],
    }
    if result.get("metrics_completions") is not None:
        print(f"/metrics /v1/completions  {result['metrics_completions']:.0f} answered (both processes)")
        checks["/metrics' /v1/completions requests == requests sent"] = (
            result["metrics_completions"] == result["requests_sent"]
        )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return all(checks.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=6, help="clients sending at once")
    parser.add_argument("--threads", type=int, default=1, help="ENGINE_NUM_THREADS of each process")
    parser.add_argument("--limited-rpm", type=int, default=5, help="the limited key's requests a minute")
    parser.add_argument("--postgres", default=POSTGRES_URL, help="a PostgreSQL database to create the soak's from")
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if nginx_binary() is None:
        print("nginx is not installed (.ci/install-nginx)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="soak-") as directory:
        result = run(args, Path(directory))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if report(result) else 1


if __name__ == "__main__":
    sys.exit(main())
