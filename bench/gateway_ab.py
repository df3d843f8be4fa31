"""The gateway's cost, A against B: requests/s of ``max_tokens: 1`` requests from two checkouts' servers.

    .venv/bin/python bench/gateway_ab.py /work/main .            # 4 rounds of 8 s each, alternating
    .venv/bin/python bench/gateway_ab.py A B --rounds 6 --seconds 10 --prompt-tokens 1

Each checkout's own daphne server is started from its own folder (its own SQLite database, user and
key, as ``testing/live_server.py`` does), both stay up, and the load goes to one at a time in the
order A B B A A B ..., so a slow minute of a shared machine falls on both.  The load is issue 12's
requests/s figure: ``--clients`` (16) clients each sending non-streamed ``max_tokens: 1`` requests of
``--prompt-tokens`` (16) tokens back to back (``bench_serving.py``'s prompts, greedy, end of sequence
suppressed).  Prints requests/s per round and B / A of the medians, and the server's CPU per request
(from ``/proc``, steadier than requests/s on a shared machine): in all, on the event loop's thread,
and on short-lived threads (Django's per-request database threads); the rest is the engine's
thread and torch's.  ``--profile DIR`` records py-spy's raw stacks (GIL holders only) of each
server during the last round, when ``py-spy`` is on ``PATH`` or named by ``PY_SPY``.
MODEL_WEIGHTS is ``float32`` as in ``bench_serving.py`` unless the environment names another.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_serving import EOS, Prompts, cpu_info, cpu_line  # noqa: E402
from inference.model_loader import converted_gguf_dir, embedded_gguf_path  # noqa: E402
from testing.live_server import MODEL, free_port, wait_healthy  # noqa: E402


@dataclass
class Server:
    name: str
    checkout: Path
    process: subprocess.Popen
    url: str
    key: str
    log: Path


def manage(checkout: Path, env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        raise RuntimeError(f"{checkout}: manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def start(name: str, checkout: Path, directory: Path) -> Server:
    """The checkout's daphne on a new SQLite database, with a user and a key, once ``/healthz`` says 200."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {
        "MODEL_WEIGHTS": "float32",  # as bench_serving.py's servers, unless the environment says otherwise
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "completions_site.settings",
        "DATABASE_URL": f"sqlite:///{directory / 'server.sqlite3'}",
        "API_LIMITS_REDIS_PREFIX": f"gateway-ab:{uuid.uuid4().hex[:12]}:",
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": os.urandom(24).hex(),
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    manage(checkout, env, "migrate", "--noinput", "-v", "0")
    manage(checkout, env, "shell", "-c", "from django.contrib.auth.models import User; User.objects.create_user('ab')")
    key = manage(checkout, env, "create_api_key", "--name", "ab", "--user", "ab").strip().splitlines()[-1]
    port = free_port()
    log = directory / "daphne.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "completions_site.asgi:application"],
        cwd=checkout,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = Server(name, checkout, process, f"http://127.0.0.1:{port}", key, log)
    try:
        wait_healthy(process, server.url, log)
    except RuntimeError as error:
        stop(server)
        raise RuntimeError(f"{name}: {error}") from None
    return server


def stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()


async def load(server: Server, prompts: list[str], seconds: float, clients: int) -> tuple[float, int, list[str]]:
    """``clients`` clients sending ``max_tokens: 1`` requests for ``seconds``: (requests/s, ok, errors)."""
    loop = asyncio.get_running_loop()
    headers = {"Authorization": f"Bearer {server.key}"}
    ok: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
        started = time.perf_counter()
        stop_at = loop.time() + seconds

        async def one_client(index: int) -> None:
            i = index
            while loop.time() < stop_at:
                body = {
                    "model": MODEL,
                    "prompt": prompts[i % len(prompts)],
                    "max_tokens": 1,
                    "temperature": 0,
                    "logit_bias": {str(EOS): -100},
                }
                i += clients
                try:
                    response = await client.post("/v1/completions", json=body, headers=headers)
                except httpx.HTTPError as error:
                    errors.append(f"{type(error).__name__}: {error}")
                    continue
                if response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 1:
                    ok.append(time.perf_counter())
                else:
                    errors.append(f"HTTP {response.status_code}: {response.text[:160]}")

        await asyncio.gather(*(one_client(i) for i in range(clients)))
    wall = max(ok) - started if ok else 0.0
    return (len(ok) / wall if wall else 0.0), len(ok), errors


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """CPU seconds (user + system) of process ``pid``, or of its thread ``thread``, from ``/proc``."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of ``pid``."""
    seconds = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            seconds[int(name)] = cpu_seconds(pid, int(name))
        except (FileNotFoundError, ProcessLookupError):
            pass  # it ended meanwhile
    return seconds


def profile(server: Server, seconds: float, directory: Path) -> subprocess.Popen | None:
    spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if not spy:
        print("py-spy not found: no profile", flush=True)
        return None
    out = directory / f"{server.name}.txt"
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(server.process.pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(out),
            "--threads",
            "--gil",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="checkout A (the baseline)")
    parser.add_argument("b", type=Path, help="checkout B")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per server (default 4)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of load per round (default 8)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--profile", type=Path, help="write py-spy raw stacks of each server's last round here")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    prompts_maker = Prompts(
        AutoTokenizer.from_pretrained(converted_gguf_dir(embedded_gguf_path(), ROOT / ".cache" / "models"))
    )
    prompts = [prompts_maker.make(args.prompt_tokens) for _ in range(256)]
    print(cpu_line(cpu_info()), flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gateway-ab-") as tmp:
        servers = [start("A", args.a.resolve(), Path(tmp) / "a"), start("B", args.b.resolve(), Path(tmp) / "b")]
        try:
            for server in servers:  # a warm-up round each: first requests compile and fill caches
                asyncio.run(load(server, prompts, 2.0, args.clients))
            figures: dict[str, list[float]] = {"A": [], "B": []}
            cpu: dict[str, list[float]] = {"A": [], "B": []}
            loop_cpu: dict[str, list[float]] = {"A": [], "B": []}
            passing: dict[str, list[float]] = {"A": [], "B": []}
            for round_index in range(args.rounds):
                order = servers if round_index % 2 == 0 else servers[::-1]
                for server in order:
                    spy = None
                    if args.profile and round_index == args.rounds - 1:
                        args.profile.mkdir(parents=True, exist_ok=True)
                        spy = profile(server, args.seconds, args.profile)
                    pid = server.process.pid
                    before = cpu_seconds(pid), cpu_seconds(pid, pid)
                    threads_before = thread_cpu_seconds(pid)
                    rps, ok, errors = asyncio.run(load(server, prompts, args.seconds, args.clients))
                    threads_after = thread_cpu_seconds(pid)
                    lasting = sum(threads_after[t] - threads_before[t] for t in threads_after if t in threads_before)
                    # Threads that started or ended during the round: Django's per-request threads
                    # (database calls, request signals), whose time the process total keeps.
                    passing_ms = (cpu_seconds(pid) - before[0] - lasting) * 1000 / max(ok, 1)
                    passing[server.name].append(passing_ms)
                    process_ms, loop_ms = (
                        (cpu_seconds(pid) - before[0]) * 1000 / max(ok, 1),
                        (cpu_seconds(pid, pid) - before[1]) * 1000 / max(ok, 1),
                    )
                    cpu[server.name].append(process_ms)
                    loop_cpu[server.name].append(loop_ms)
                    if spy is not None:
                        spy.wait(timeout=60)
                    figures[server.name].append(rps)
                    note = f", {len(errors)} errors: {sorted(set(errors))[:2]}" if errors else ""
                    print(
                        f"round {round_index + 1} {server.name} ({server.checkout}): {rps:.1f} req/s ({ok} ok{note}); "
                        f"CPU per request: {process_ms:.1f} ms in all, {loop_ms:.1f} ms on the event loop's thread, "
                        f"{passing_ms:.1f} ms on short-lived threads",
                        flush=True,
                    )
        finally:
            for server in servers:
                stop(server)
    a, b = statistics.median(figures["A"]), statistics.median(figures["B"])
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(
        f"median req/s: A {a:.1f}, B {b:.1f}; B / A = {b / a:.2f} "
        f"({args.clients} clients, {args.prompt_tokens}-token prompts, max_tokens 1)"
    )
    ca, cb = statistics.median(cpu["A"]), statistics.median(cpu["B"])
    la, lb = statistics.median(loop_cpu["A"]), statistics.median(loop_cpu["B"])
    print(
        f"median CPU ms per request: A {ca:.1f}, B {cb:.1f} (B / A = {cb / ca:.2f}); "
        f"on the event loop's thread: A {la:.1f}, B {lb:.1f} (B / A = {lb / la:.2f})"
    )
    pa, pb = statistics.median(passing["A"]), statistics.median(passing["B"])
    print(f"on short-lived threads (Django's per-request database threads): A {pa:.1f}, B {pb:.1f}")


if __name__ == "__main__":
    main()
