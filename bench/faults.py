"""Faults under load: no served request goes unrecorded, and no fault outside a process is a 500.

    .venv/bin/python bench/faults.py                    # about 3 minutes
    .venv/bin/python bench/faults.py --json faults.json --clients 6

Two daphne processes (``testing/live_server.py``) share PostgreSQL, Redis and one usage-journal
folder, with ``DATABASE_POOL_TIMEOUT`` shortened to 8 s so that an outage longer than the pool's
wait takes seconds, not a minute.  By default the PostgreSQL cluster (``pg_createcluster``, port
5440) and the Redis server (port 6390) are the run's own, created and removed by it, so that the
machine's own services (and whoever uses them) are not restarted; ``--shared-services`` uses
``pg_ctlcluster 15 main`` and the Redis at ``redis://127.0.0.1:6379`` instead (root only; Redis is
restarted with ``redis-cli shutdown nosave`` and ``redis-server /etc/redis/redis.conf``).  There is
no nginx: the clients balance over the two processes themselves, sending a request that found a
process gone (connection refused) to the other one, as nginx's ``proxy_next_upstream`` would.

``--clients`` clients send plain and streamed completions for the whole run (a client waits 1 s
after a 503, as OpenAI's clients back off) while these faults come in turn: PostgreSQL stopped for
4 s (within the pool's wait) and for 14 s (past it), Redis restarted (3 s down, its data lost), the
journals' disk full for 6 s, process 2 killed with SIGKILL and started again, and process 2 killed
while PostgreSQL is stopped (so its journal holds records) and started again after.  The journal
folder is a 32 MiB tmpfs of its own (root only; without it the full-disk fault is skipped, and
``tests/integration/test_usage_journal.py`` covers it): the fault empties the journals'
write-ahead logs, which a journal that ran a while would otherwise write again in place on a full
disk, then fills the tmpfs with a file, and deletes the file when it ends.

For each phase and in total it prints the requests sent, the answers by status (with the error's
code), 5xx other than 503 (must be 0), 503s without ``Retry-After`` (must be 0), the usage records
of answered requests (a 200 body, or a stream that delivered tokens, ended or cut) that are missing
from the database once the journals are empty ("lost", must be 0), the records that hold fewer
completion tokens than their client was told of (a body's usage, a stream's tokens;
"under_recorded", must be 0; each request's unique ``user`` field finds its record), the requests
whose connection a killed process reset or refused ("killed_process": no answer, or a stream cut,
"cut", which its provisional record in the journal bills; a plain request that had finished and
was recorded when its process died before the answer went out is "killed_recorded"), any other
transport failure ("unexplained", must be 0), the requests a process that was gone refused and
the other served ("rerouted"), and the seconds from a fault's end until both processes'
``/healthz`` answered 200.  Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from testing.live_server import MODEL, LiveServer, start_server, stop_server

NO_EOS = {"0": -100, "2": -100}  # every request generates exactly max_tokens
POOL_TIMEOUT = 8


@dataclass
class Outcome:
    """What one client saw of one request."""

    phase: str
    status: int | None  # None: no HTTP answer (the connection failed)
    request_id: str = ""
    stream: bool = False
    user: str = ""  # the request's "user" field, unique: its usage record is found by it
    tokens: int = 0  # content events received (streams)
    told: int = 0  # completion tokens the client was told of (the body's usage, the stream's logprobs)
    finished: bool = False  # a 200 body, or a stream that ended with [DONE]
    retry_after: bool = False
    code: str = ""
    failure: str = ""  # the transport error, if any
    server: str = ""  # the process's URL
    rerouted: bool = False  # refused by a process that was gone, sent to the other one
    started: float = 0.0  # time.monotonic() when sent and when its answer ended or failed
    ended: float = 0.0

    @property
    def answered(self) -> bool:
        """The client was served (a 200 body, or a stream's tokens): its usage must be in the database."""
        return self.status == 200 and (self.tokens > 0 if self.stream else self.finished)


@dataclass
class Services:
    """PostgreSQL and Redis, with the commands that stop and start them."""

    postgres_url: str
    redis_url: str
    cluster: str
    redis_port: int
    shared: bool
    redis_process: subprocess.Popen | None = None

    def stop_postgres(self) -> None:
        subprocess.run(["pg_ctlcluster", "15", self.cluster, "stop", "-m", "fast"], check=True)

    def start_postgres(self) -> None:
        subprocess.run(["pg_ctlcluster", "15", self.cluster, "start"], check=True)

    def stop_redis(self) -> None:
        if self.shared:
            subprocess.run(["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"], check=False)
        elif self.redis_process is not None:
            self.redis_process.terminate()
            self.redis_process.wait(timeout=10)

    def start_redis(self) -> None:
        if self.shared:
            subprocess.run(["redis-server", "/etc/redis/redis.conf", "--save", "", "--appendonly", "no"], check=True)
        else:
            self.redis_process = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(self.redis_port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                stdout=subprocess.DEVNULL,
            )
        for _ in range(50):
            if subprocess.run(["redis-cli", "-p", str(self.redis_port), "ping"], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("Redis did not start again")


def own_services(port: int, redis_port: int) -> Services:
    """A PostgreSQL cluster ``faults`` on ``port`` (trust authentication, a ``root`` superuser, a
    ``faults`` database) and a Redis server on ``redis_port``, both new."""
    subprocess.run(["pg_createcluster", "15", "faults", "-p", str(port)], check=True, stdout=subprocess.DEVNULL)
    Path("/etc/postgresql/15/faults/pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
    )
    subprocess.run(["pg_ctlcluster", "15", "faults", "start"], check=True)
    psql = ["runuser", "-u", "postgres", "--", "psql", "-p", str(port), "-qc"]
    subprocess.run([*psql, "CREATE ROLE root SUPERUSER LOGIN"], check=True)
    subprocess.run([*psql, "CREATE DATABASE faults OWNER root"], check=True)
    services = Services(
        f"postgres://root@127.0.0.1:{port}/faults",
        f"redis://127.0.0.1:{redis_port}/0",
        "faults",
        redis_port,
        shared=False,
    )
    services.start_redis()
    return services


@dataclass
class JournalDisk:
    """The journals' folder on a tmpfs of its own, so that the full-disk fault fills this folder
    and nothing else of the machine (mounting needs root)."""

    folder: Path
    mounted: bool = False
    reason: str = ""  # why it is not mounted

    def mount(self, size: str = "32m") -> None:
        self.folder.mkdir(parents=True)
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(self.folder)]
        result = subprocess.run(mount, capture_output=True, text=True)
        self.mounted = result.returncode == 0
        self.reason = "" if self.mounted else f"`{' '.join(mount)}` failed: {result.stderr.strip()}"

    def fill(self) -> int:
        """Empty the journals' write-ahead logs, then fill the disk; returns the bytes written.

        A write-ahead log that has grown is written again in place after each checkpoint, so a
        journal that ran a while keeps working on a full disk until it must grow; emptying the logs
        (as they are after a start) makes the next append need space.
        """
        for path in self.folder.glob("*.sqlite3"):
            with closing(sqlite3.connect(path, timeout=10)) as journal:
                journal.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        written = 0
        with open(self.folder / "filler", "wb", buffering=0) as filler:
            for block in (1 << 16, 1 << 12):
                try:
                    while True:
                        written += filler.write(bytes(block))
                except OSError:
                    pass
        return written

    def free(self) -> None:
        (self.folder / "filler").unlink(missing_ok=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "--lazy", str(self.folder)], check=False)
            self.mounted = False


def remove_own_services(services: Services) -> None:
    services.stop_redis()
    subprocess.run(["pg_dropcluster", "15", "faults", "--stop"], check=False)


@dataclass
class Cluster:
    """The two server processes and what they share."""

    workdir: Path
    database_url: str
    settings: dict[str, str]
    servers: list[LiveServer | None] = field(default_factory=list)
    key: str = ""
    kills: list[tuple[str, float]] = field(default_factory=list)  # (URL, time.monotonic()) of each SIGKILL

    def start(self, index: int) -> None:
        starts = len(list(self.workdir.glob(f"process-{index + 1}-*")))
        folder = self.workdir / f"process-{index + 1}-{starts + 1}"  # a log of its own for each start
        folder.mkdir()
        settings = {**self.settings, "USAGE_JOURNAL_ID": f"process-{index + 1}"}
        server = start_server(folder, database_url=self.database_url, key=self.key or None, **settings)
        self.key = server.key
        while len(self.servers) <= index:
            self.servers.append(None)
        self.servers[index] = server

    def kill(self, index: int) -> None:
        server = self.servers[index]
        assert server is not None
        self.servers[index] = None
        self.kills.append((server.base_url, time.monotonic()))
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()

    def urls(self) -> list[str]:
        return [server.base_url for server in self.servers if server is not None]


async def one_request(client: httpx.AsyncClient, cluster: Cluster, phase: list[str], turn: int) -> Outcome:
    """One completion, plain or streamed, to the next process; a refused connection goes to the other."""
    stream = random.random() < 0.5
    user = f"faults-{turn}"
    body = {
        "model": MODEL,
        "prompt": f"Fault {turn}: once upon a time",
        "max_tokens": random.randint(8, 24),
        "logit_bias": NO_EOS,
        "stream": stream,
        "user": user,
        **({"logprobs": 0} if stream else {}),  # a stream's chunks then list their tokens
    }
    headers = {"Authorization": f"Bearer {cluster.key}"}
    urls = cluster.urls()
    outcome = Outcome(phase[0], None, stream=stream, user=user, started=time.monotonic())
    try:
        for attempt in range(2):
            outcome.server = urls[(turn + attempt) % len(urls)]
            try:
                await send(client, outcome.server + "/v1/completions", body, headers, outcome)
                outcome.failure = ""
                return outcome
            except httpx.ConnectError as error:
                outcome.failure = type(error).__name__
                outcome.rerouted = True  # the balancer's next upstream
            except httpx.HTTPError as error:
                outcome.failure = type(error).__name__
                return outcome
        return outcome
    finally:
        outcome.ended = time.monotonic()


async def send(client: httpx.AsyncClient, url: str, body: dict, headers: dict, outcome: Outcome) -> None:
    """Send one completion and note in ``outcome`` what came back; raises httpx's transport errors."""
    async with client.stream("POST", url, json=body, headers=headers) as response:
        outcome.status = response.status_code
        outcome.request_id = response.headers.get("x-request-id", "")
        outcome.retry_after = "retry-after" in response.headers
        if not outcome.stream or response.status_code != 200:
            answer = json.loads(await response.aread() or b"{}")
            if response.status_code == 200:
                outcome.finished = True
                outcome.told = answer["usage"]["completion_tokens"]
            else:
                outcome.code = str((answer.get("error") or {}).get("code") or "")
            return
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                outcome.finished = True
            elif line.startswith("data: ") and '"error"' not in line:
                outcome.tokens += 1
                for choice in json.loads(line[len("data: ") :])["choices"]:
                    outcome.told += len((choice.get("logprobs") or {}).get("tokens") or [])


async def load(cluster: Cluster, clients: int, phase: list[str], stop: asyncio.Event, outcomes: list[Outcome]) -> None:
    turns = iter(range(10**9))

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            outcome = await one_request(client, cluster, phase, next(turns))
            outcomes.append(outcome)
            if outcome.status == 503:
                await asyncio.sleep(1)  # a client backs off before it retries, as OpenAI's do

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))


async def wait_healthy(cluster: Cluster, timeout: float = 60) -> float:
    """Seconds until every running process's ``/healthz`` answers 200."""
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() - started < timeout:
            try:
                answers = [await client.get(url + "/healthz") for url in cluster.urls()]
                if all(answer.status_code == 200 for answer in answers):
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    return float("inf")


async def faults(
    cluster: Cluster, services: Services, disk: JournalDisk, phase: list[str], settle: float
) -> dict[str, float]:
    """Inject each fault in turn; returns the seconds to healthy after each one's end."""
    recovery: dict[str, float] = {}

    async def step(name: str, seconds: float) -> None:
        phase[0] = name
        print(f"  {name}", flush=True)
        await asyncio.sleep(seconds)

    async def run(command, *args) -> None:
        await asyncio.to_thread(command, *args)

    await step("baseline", settle)
    for name, down in (("postgres stopped 4 s", 4), (f"postgres stopped 14 s (pool waits {POOL_TIMEOUT} s)", 14)):
        await run(services.stop_postgres)
        await step(name, down)
        await run(services.start_postgres)
        recovery[name] = await wait_healthy(cluster)
        await step(name + ", after", settle)
    await run(services.stop_redis)
    await step("redis restarted", 3)
    await run(services.start_redis)
    recovery["redis restarted"] = await wait_healthy(cluster)
    await step("redis restarted, after", settle)

    if disk.mounted:
        name = "journal disk full"
        await run(disk.fill)
        await step(name, 6)
        await run(disk.free)
        recovery[name] = await wait_healthy(cluster)
        await step(name + ", after", settle)
    else:
        print(f"  journal disk full: skipped ({disk.reason})", flush=True)

    await step("process 2 killed", 0)
    await run(cluster.kill, 1)
    await run(cluster.start, 1)
    recovery["process 2 killed"] = await wait_healthy(cluster)
    await step("process 2 killed, after", settle)

    await run(services.stop_postgres)
    await step("process 2 killed during a postgres outage", 6)
    await run(cluster.kill, 1)
    await asyncio.sleep(2)
    await run(services.start_postgres)
    await run(cluster.start, 1)
    recovery["process 2 killed during a postgres outage"] = await wait_healthy(cluster)
    await step("process 2 killed during a postgres outage, after", settle)
    return recovery


def journal_records(cluster: Cluster) -> float:
    """Records waiting in the running processes' journals (their ``/metrics``)."""
    total = 0.0
    for url in cluster.urls():
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("completions_usage_journal_records "):
                total += float(line.split()[-1])
    return total


@dataclass(frozen=True)
class Record:
    """What the database holds of one request."""

    request_id: str
    completion_tokens: int
    status_code: int
    finish_reason: str


def usage_records(database_url: str) -> dict[str, Record]:
    """The usage records, by the requests' ``user`` field."""
    import psycopg

    query = 'SELECT "user", request_id, completion_tokens, status_code, finish_reason FROM keys_usagerecord'
    with psycopg.connect(database_url) as connection:
        return {row[0]: Record(*row[1:]) for row in connection.execute(query)}


RESET_BY_KILL = "connection reset by the killed process"
REFUSED_AFTER_KILL = "connection refused by the killed process"


def cause(outcome: Outcome, kills: list[tuple[str, float]]) -> str:
    """Why a request got no complete answer over its connection: its process was killed while it
    ran (SIGKILL closes the process's sockets: httpx's ``RemoteProtocolError`` or ``ReadError``),
    or an unexplained transport failure."""
    for url, at in kills:
        if url == outcome.server and outcome.started <= at <= outcome.ended:
            return RESET_BY_KILL
        if url == outcome.server and at <= outcome.ended and outcome.failure == "ConnectError":
            return REFUSED_AFTER_KILL  # both processes were tried: the other was gone too
    return "unexplained"


def describe(record: Record | None) -> str:
    if record is None:
        return "no record"
    return f"recorded: {record.status_code}, {record.completion_tokens} tokens, {record.finish_reason}"


def report(
    outcomes: list[Outcome], records: dict[str, Record], recovery: dict[str, float], kills: list[tuple[str, float]]
) -> dict:
    phases: dict[str, dict] = {}
    for outcome in outcomes:
        row = phases.setdefault(
            outcome.phase,
            {
                "sent": 0,
                "statuses": Counter(),
                "lost": 0,
                "under_recorded": 0,
                "cut": 0,
                "killed_process": 0,
                "killed_recorded": 0,
                "unexplained": 0,
                "rerouted": 0,
                "5xx_not_503": 0,
                "503_without_retry_after": 0,
                "answered": 0,
            },
        )
        row["sent"] += 1
        row["rerouted"] += outcome.rerouted
        if outcome.status is None:
            label = f"{outcome.failure or 'none'}: {cause(outcome, kills)}"
        else:
            label = f"{outcome.status} {outcome.code}".strip()
        row["statuses"][label] += 1
        if outcome.status is not None and outcome.status >= 500 and outcome.status != 503:
            row["5xx_not_503"] += 1
        if outcome.status == 503 and not outcome.retry_after:
            row["503_without_retry_after"] += 1
        if outcome.status == 200 and outcome.stream and outcome.tokens and not outcome.finished:
            row["cut"] += 1  # a stream whose tokens stopped coming: the process was killed
        record = records.get(outcome.user)
        if outcome.failure:
            killed = cause(outcome, kills) != "unexplained"
            row["killed_process" if killed else "unexplained"] += 1
            # A plain request that finished, whose answer did not go out (a cut stream is answered).
            row["killed_recorded"] += killed and record is not None and not outcome.answered
        if outcome.answered:
            row["answered"] += 1
            row["lost"] += record is None or record.request_id != outcome.request_id
        if record is not None and record.completion_tokens < outcome.told:
            row["under_recorded"] += 1  # fewer tokens recorded than the client was told of
    for row in phases.values():
        row["statuses"] = dict(sorted(row["statuses"].items()))
    failures = [
        f"{o.phase}: {o.failure} from {o.server} after {o.ended - o.started:.1f} s, {cause(o, kills)}"
        f" (status {o.status}, stream {o.stream}, {o.told} tokens told; {describe(records.get(o.user))})"
        for o in outcomes
        if o.failure
    ]
    totals = {
        name: sum(row[name] for row in phases.values())
        for name in (
            "sent",
            "answered",
            "lost",
            "under_recorded",
            "cut",
            "killed_process",
            "killed_recorded",
            "unexplained",
            "rerouted",
            "5xx_not_503",
            "503_without_retry_after",
        )
    }
    totals["statuses"] = dict(sorted(sum((Counter(row["statuses"]) for row in phases.values()), Counter()).items()))
    return {
        "phases": phases,
        "totals": totals,
        "records_written": len(records),
        "seconds_to_healthy": {name: round(seconds, 1) for name, seconds in recovery.items()},
        "transport_failures": failures,
    }


async def drive(
    args: argparse.Namespace, cluster: Cluster, services: Services, disk: JournalDisk
) -> tuple[list[Outcome], dict]:
    phase = ["baseline"]
    outcomes: list[Outcome] = []
    stop = asyncio.Event()
    clients = asyncio.create_task(load(cluster, args.clients, phase, stop, outcomes))
    try:
        recovery = await faults(cluster, services, disk, phase, args.settle)
    finally:
        stop.set()
        await clients
    return outcomes, recovery


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--settle", type=float, default=6, help="seconds of load between faults (default 6)")
    parser.add_argument("--threads", type=int, default=1, help="ENGINE_NUM_THREADS of each process (default 1)")
    parser.add_argument(
        "--shared-services",
        action="store_true",
        help="restart the machine's own PostgreSQL cluster 15/main and Redis on 6379",
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()

    if args.shared_services:
        services = Services("postgres://root@127.0.0.1:5432/test", "redis://127.0.0.1:6379/0", "main", 6379, True)
        from testing.postgres import scratch_database

        database = scratch_database("completions_faults", services.postgres_url)
    else:
        services = own_services(5440, 6390)
        from contextlib import nullcontext

        database = nullcontext(services.postgres_url)
    workdir = Path(tempfile.mkdtemp(prefix="faults-"))
    disk = JournalDisk(workdir / "journal")
    disk.mount()
    cluster: Cluster | None = None
    try:
        with database as database_url:
            settings = {
                "REDIS_URL": services.redis_url,
                "API_LIMITS_REDIS_PREFIX": f"completions-site-faults:{uuid.uuid4().hex[:12]}:",
                "API_DEFAULT_MAX_CONCURRENT": "8",  # concurrency slots are counted, leased and renewed
                "DATABASE_POOL_TIMEOUT": str(POOL_TIMEOUT),
                "USAGE_JOURNAL_DIR": str(disk.folder),
                "ENGINE_NUM_THREADS": str(args.threads),
                "LOG_LEVEL": "WARNING",
            }
            cluster = Cluster(workdir, database_url, settings)
            cluster.start(0)
            cluster.start(1)
            print(f"faults: {args.clients} clients on {', '.join(cluster.urls())}; logs in {workdir}", flush=True)
            outcomes, recovery = asyncio.run(drive(args, cluster, services, disk))
            deadline = time.monotonic() + 30
            while journal_records(cluster) and time.monotonic() < deadline:
                time.sleep(0.5)
            result = report(outcomes, usage_records(database_url), recovery, cluster.kills)
            result["journal_records_left"] = journal_records(cluster)
            for server in cluster.servers:
                if server is not None:
                    stop_server(server)
            cluster = None
    finally:
        if cluster is not None:
            for server in cluster.servers:
                if server is not None:
                    stop_server(server)
        disk.unmount()
        if not args.shared_services:
            remove_own_services(services)

    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    totals = result["totals"]
    failed = (
        totals["lost"]
        or totals["under_recorded"]
        or totals["5xx_not_503"]
        or totals["503_without_retry_after"]
        or totals["unexplained"]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
