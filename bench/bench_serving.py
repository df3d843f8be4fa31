"""Serving benchmark (issues 4 and 12): our server against its peers, over HTTP, on the same workloads.

    make bench                                   # installs bench/requirements.txt, then the full run
    make bench BENCH_ARGS="--quick --json out.json"
    .venv/bin/python bench/bench_serving.py --quick             # N = 1 and 8 only, fewer requests
    .venv/bin/python bench/bench_serving.py --json results.json # also write every figure as JSON
    .venv/bin/python bench/bench_serving.py --no-peers          # our server only
    .venv/bin/python bench/bench_serving.py --phases n1,n8,scoring --servers ours,llama-server
    .venv/bin/python bench/bench_serving.py --baseline before.json  # the scoring goal: 4x that run's

The run prints the CPU (model name; avx2, fma, avx512f, avx512_bf16 and amx flags; the capability
torch reports, which ``ATEN_CPU_CAPABILITY=avx2`` lowers), the thread and ISA variables set, our
engine's ``runner`` and ``weights`` from ``/healthz`` (``n/a`` when it does not report them), the
figures of every server, and issue 12's goals: ours / llama-server for throughput, requests/s and
idle TTFT, our own figure for the rest, each ``met`` or ``NOT MET``.

Every server is started first, each in a subprocess; then the phases run in turns, on one server at
a time while the others sit idle, the servers alternating which goes first from one phase to the next
(ABBA), so that a ratio compares figures taken seconds apart, not minutes apart on a shared machine
whose speed drifts (a first version measured each server's whole run in turn, and ratios moved by a
fifth between runs); ``--sequential`` does that still.  Every server is stopped at the end (also on
an error or Ctrl-C):

- ours: daphne with the embedded model (``testing/live_server.py``: its own SQLite database and key),
  ``DJANGO_DEBUG=false``, every other setting at its default (bfloat16 on this CPU);
- ``transformers serve`` (the transformers CLI) on the converted copy of the same model, on CPU in
  bfloat16, as it runs by default: one ``generate()`` at a time, requests queued behind it (its
  ``--continuous-batching`` mode, paged attention made for GPUs, is left out);
- llama.cpp's ``llama-server`` on the embedded GGUF file with 8 slots, only when it is on ``PATH``
  or named by ``LLAMA_SERVER``; the table then also gives our aggregate tok/s at N = 32 over its
  own with 8 slots at N = 8 (issue 4's target: at least 1.5).

llama-server is found as ``LLAMA_SERVER``, else the build of ``bench/build_llama_server.sh`` under
``.cache/llama.cpp/``, else ``PATH``.

Workloads (streamed unless said otherwise; temperature 0; the tokenizer's stop tokens suppressed with
``logit_bias: {"0": -100, "2": -100}``, so that every request makes ``max_tokens`` tokens; with
``--model``, prompts are sent as token ids, so that every server counts the same tokens whatever
tokenizer the file declares):

- N = 1, 8, 32 concurrent clients, each sending 16-token prompts for 128 new tokens, back to back
  (3, 2 and 1 requests per client);
- time to first token of a 512-token prompt at idle (median of 3, ``max_tokens: 1``);
- time to first token of new requests (16-token prompts) arriving every 0.5 s while 8 streams run;
- peak RSS with 32 streams of 512-token contexts (384-token prompts + 128 new tokens);
- requests/s of non-streamed ``max_tokens: 1`` requests from 16 clients over about 10 s, with
  16-token prompts, then again with 1-token prompts (nearly no model work: the HTTP and Django path).

Issue 12's phases (``--phases`` names them; the last three run against our server only):

- *warmup*: the time of each of the first 3 completions (16-token prompts, 32 tokens) right after
  ``/healthz`` answered 200, before anything else is sent, against 3 more after the contention phase,
  when the server has answered 100-odd requests;
- *scoring*: what lm-evaluation-harness sends for log-likelihoods: 64 non-streamed requests with
  ``echo: true, logprobs: 1, max_tokens: 0`` and 160-token prompts from 8 clients (16 in ``--quick``):
  requests/s and prompt tokens/s (llama-server has no prompt log-probabilities);
- *contention*: tokens/s at 1 stream (64 tokens) and 8 streams (32 tokens each), quiet and then
  beside two busy loops (``python -c "while True: pass"``, killed after), and then a second server of
  ours started beside the first, both under 8 streams at once: the share of the quiet 8-stream
  figure each keeps (goal: at least 40%);
- *fairness*: the time to first token of a short request sent while one streamed request of 64
  prompts x 2,000 tokens is being prefilled (goal: within 1 s); each wait is capped at the phase's
  deadline, then the big request is dropped.  It runs last, as the engine may go on with the
  dropped request for a while.

Figures:

- *aggregate tok/s*: tokens received by all clients / wall time from the first request to the
  last token;
- *per-stream tok/s*: each stream's decode rate, (tokens - 1) / (last token - first token), the
  mean over streams;
- *TTFT*: from sending the request to the chunk that carries its first token;
- *peak RSS*: the server process (and any children), sampled with psutil every 50 ms.

Tokens are counted from the stream: our server sends one chunk per token (verified against the
usage chunk of ``stream_options: {"include_usage": true}``).  ``transformers serve`` sends one chunk
per decoded piece of text, so its tokens are read from the usage of its last chunk; it ignores
``logit_bias``, so it gets the same effect through its own ``generation_config`` field
(``suppress_tokens: [2]``) and its token counts are checked to be 128 as well.  (Its streams end
without ``data: [DONE]``; a finish reason ends them.)

Every phase has a deadline (``FULL`` and ``QUICK`` below), and the server is left to go idle for at
most 8 s after each (60 s after the fairness phase), so a full run takes about 15 minutes at worst, when every phase runs out.  A request still waiting or streaming at the deadline is cut: the
tokens it received count, and a first token it never got makes its TTFT unknown, shown as
``>deadline`` (which bounds the percentile from below).  ``transformers serve`` runs one request at
a time, so its concurrent phases end at their deadlines and its figures there are censored.
The machine is shared: the load average at the start and the end is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference.model_loader import converted_gguf_dir, embedded_gguf_path  # noqa: E402
from testing.live_server import MODEL, free_port, start_server, stop_server  # noqa: E402

EOS = 2  # SmolLM2's <|im_end|>, the end of sequence
# Every id a server may stop on: EOS and <|endoftext|> (the ChatML family declares both).
STOP_IDS = (0, EOS)
NEW_TOKENS = 128
SHORT_PROMPT = 16
LONG_PROMPT = 512
CONTEXT_PROMPT = 384  # + 128 new tokens = 512-token contexts
MB = 1_000_000


# --- Plan: what each mode runs, and the deadlines --------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Requests per phase and each phase's deadline (s); the peers get ``peer_deadlines`` instead."""

    concurrency: tuple[int, ...]
    requests_per_client: dict[int, int]
    idle_ttft_requests: int
    probes: int
    context_streams: int  # 0: the 32 x 512 phase is skipped
    rps_seconds: float
    deadlines: dict[str, float]
    peer_deadlines: dict[str, float]
    scoring_requests: int = 64
    contention_seconds: float = 20.0


FULL = Plan(
    concurrency=(1, 8, 32),
    requests_per_client={1: 3, 8: 2, 32: 1},
    idle_ttft_requests=3,
    probes=20,
    context_streams=32,
    rps_seconds=10.0,
    deadlines={
        "n1": 30,
        "n8": 40,
        "n32": 50,
        "idle_ttft": 15,
        "load_ttft": 30,
        "context": 70,
        "rps": 15,
        "scoring": 90,
        "fairness": 30,
        "warmup": 30,
    },
    peer_deadlines={
        "n1": 20,
        "n8": 20,
        "n32": 20,
        "idle_ttft": 15,
        "load_ttft": 20,
        "context": 20,
        "rps": 15,
        "warmup": 30,
    },
    scoring_requests=64,
    contention_seconds=20.0,
)
QUICK = Plan(
    concurrency=(1, 8),
    requests_per_client={1: 1, 8: 1},
    idle_ttft_requests=3,
    probes=6,
    context_streams=0,
    rps_seconds=4.0,
    deadlines={
        "n1": 20,
        "n8": 30,
        "idle_ttft": 15,
        "load_ttft": 20,
        "rps": 10,
        "scoring": 45,
        "fairness": 15,
        "warmup": 30,
    },
    peer_deadlines={"n1": 15, "n8": 15, "idle_ttft": 10, "load_ttft": 15, "rps": 8, "warmup": 20},
    scoring_requests=16,
    contention_seconds=10.0,
)

# Every phase, in the order they run (the warm-up's second half runs after contention); ``--phases``
# picks some.  The last three are ours only (the
# peers cannot answer prompt log-probabilities, and the others measure our own process).
PHASES = (
    "warmup",
    "n1",
    "n8",
    "n32",
    "idle_ttft",
    "load_ttft",
    "context",
    "rps",
    "rps_1",
    "scoring",
    "contention",
    "fairness",
)
OURS_ONLY = {"scoring", "fairness", "contention"}


# --- Goals (issue 12) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """A goal of issue 12: on ``key`` of our results, either the ratio ours / llama-server
    (``against="llama-server"``), ours / a baseline run's (``against="baseline"``), or our figure itself
    (``against=None``), compared by ``op`` (``>=``, ``<=`` or ``<``) with ``value``."""

    label: str
    key: str
    op: str
    value: float
    against: str | None = None

    def met(self, figure: float | None) -> bool | None:
        if figure is None:
            return None
        return {">=": figure >= self.value, "<=": figure <= self.value, "<": figure < self.value}[self.op]

    @property
    def text(self) -> str:
        what = {"llama-server": "ratio ", "baseline": "x baseline "}.get(self.against, "")
        return f"{what}{self.op} {self.value:g}"


GOALS = (
    Goal("tokens/s, 1 stream", "n1.aggregate_tps", ">=", 1.0, "llama-server"),
    Goal("tokens/s in all, 8 streams", "n8.aggregate_tps", ">=", 1.5, "llama-server"),
    Goal("tokens/s in all, 32 streams", "n32.aggregate_tps", ">=", 2.0, "llama-server"),
    Goal("req/s, max_tokens 1, 16 clients, 16-token prompts", "rps.requests_per_s", ">=", 1.0, "llama-server"),
    Goal("TTFT s, 512-token prompt at idle", "idle_ttft.median_s", "<=", 0.5, "llama-server"),
    Goal("TTFT p95 s, new requests while 8 stream", "load_ttft.p95_s", "<", 0.25),
    Goal("peak RSS MB, 32 streams x 512-token contexts", "context.peak_rss_mb", "<", 1200),
    Goal("scoring prompt tok/s (64 x 160, echo+logprobs)", "scoring.prompt_tps", ">=", 4.0, "baseline"),
    Goal("fairness: short TTFT s beside 64 x 2000 tokens", "fairness.probe_ttft_max_s", "<", 1.0),
    Goal("warm-up: first 3 / later completions, time", "warmup.ratio", "<=", 1.2),
    Goal("contention: kept beside 2 busy loops, 1 stream", "contention.busy_kept_1", ">=", 0.4),
    Goal("contention: kept beside 2 busy loops, 8 streams", "contention.busy_kept_8", ">=", 0.4),
    Goal("contention: kept as one of 2 servers, 8 streams", "contention.two_servers_kept", ">=", 0.4),
)


# --- Servers ---------------------------------------------------------------------------------------


@dataclass
class Server:
    """A server under test: where it listens, how to ask it, and how to stop it."""

    name: str
    base_url: str
    model: str
    pid: int
    stop: Callable[[], None]
    headers: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)
    one_chunk_per_token: bool = False  # else tokens come from the usage of the last chunk
    sends_done: bool = True  # ends a stream with data: [DONE] (transformers serve does not)
    health_path: str | None = None  # reports running/waiting requests (ours)
    log: Path | None = None

    @property
    def url(self) -> str:
        return self.base_url + "/v1/completions"

    def body(self, prompt: Prompt, max_tokens: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logit_bias": {str(token): -100 for token in STOP_IDS},
        }
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return {**body, **self.extra_body}


# Every phase's deadline and the warm-up's limit times this (--deadline-factor).
DEADLINE_FACTOR = 1.0
# The GGUF file both servers serve (--model); None: the embedded model's.
MODEL_FILE: Path | None = None


def start_ours(directory: Path, **env: str) -> Server:
    """Our daphne server with the embedded model (or ``MODEL_FILE``), as the end-to-end tests start it,
    but with the server's own default weight formats (``MODEL_WEIGHTS=auto``, where the tests pin
    float32) unless the environment names them; ``env`` on top of ours."""
    defaults = {"MODEL_WEIGHTS": os.environ.get("MODEL_WEIGHTS", "auto")}
    if MODEL_FILE is not None:
        defaults["MODEL_PATH"] = str(MODEL_FILE)
    live = start_server(
        directory,
        DJANGO_DEBUG="false",
        DJANGO_SECRET_KEY=os.urandom(24).hex(),
        LOG_LEVEL="WARNING",
        **{**defaults, **env},
    )
    return Server(
        name="ours",
        base_url=live.base_url,
        model=MODEL,
        pid=live.process.pid,
        stop=lambda: stop_server(live),
        headers=live.headers(),
        one_chunk_per_token=True,
        health_path="/healthz",
        log=live.log,
    )


def start_process(
    name: str, argv: list[str], directory: Path, health: str, timeout: float
) -> tuple[subprocess.Popen, str, Path]:
    """Start ``argv`` (whose ``{port}`` is filled in) and wait for ``GET health`` to answer 200."""
    port = free_port()
    log = directory / f"{name}.log"
    process = subprocess.Popen(
        [arg.replace("{port}", str(port)) for arg in argv],
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base_url + health, timeout=2).status_code == 200:
                return process, base_url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    terminate(process)
    raise RuntimeError(f"{name} did not become healthy in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def terminate(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def start_transformers(directory: Path, folder: Path) -> Server:
    """``transformers serve`` pinned to the converted model, bfloat16, CPU, default (sequential) mode."""
    cli = Path(sys.executable).parent / "transformers"
    argv = [str(cli), "serve", "--device", "cpu", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", "{port}"]
    process, base_url, log = start_process("transformers", [*argv, str(folder)], directory, "/health", 300)
    return Server(
        name="transformers",
        base_url=base_url,
        model=str(folder),
        pid=process.pid,
        stop=lambda: terminate(process),
        # logit_bias is accepted and ignored; this is its way of never ending a sequence early.
        extra_body={"generation_config": json.dumps({"suppress_tokens": list(STOP_IDS)})},
        sends_done=False,
        log=log,
    )


def start_llama_server(directory: Path, binary: str, extra: Sequence[str] = ()) -> Server:
    """llama.cpp's server on the embedded GGUF file with 8 slots of 1024 tokens, the peer issue 4 names
    (its completions honour ``logit_bias``); more concurrent requests wait for a slot.  ``extra``:
    more of its flags (``-t 1``)."""
    argv = [
        binary,
        "-m",
        str(MODEL_FILE or embedded_gguf_path()),
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "-np",
        "8",
        "-c",
        "8192",
        *extra,
    ]
    process, base_url, log = start_process("llama-server", argv, directory, "/health", 300)
    return Server(
        name="llama-server",
        base_url=base_url,
        model="smollm2",
        pid=process.pid,
        stop=lambda: terminate(process),
        log=log,
    )


# --- Memory ----------------------------------------------------------------------------------------


class RssSampler:
    """Samples a process tree's RSS every 50 ms in a thread; :meth:`take_peak` restarts the peak."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self.last = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        total = 0
        for process in [self.process, *self.process.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(psutil.Error):
                value = self.rss()
                with self._lock:
                    self.last = value
                    self.peak = max(self.peak, value)

    def take_peak(self) -> int:
        with self._lock:
            peak, self.peak = self.peak, self.last
        return peak

    def __enter__(self) -> RssSampler:
        self.last = self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- One request -----------------------------------------------------------------------------------


@dataclass
class Stream:
    """One request's timeline (``time.perf_counter`` seconds) and what came back."""

    sent: float
    first: float | None = None
    last: float | None = None
    chunks: int = 0  # chunks that carried a token (ours) or text (peers)
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False  # data: [DONE] came
    cut: bool = False  # the phase's deadline came first
    max_gap: float = 0.0  # the longest wait between two chunks

    def tokens(self, server: Server) -> int:
        # The usage where it came: a server may hold a token's text back (a partial UTF-8 character
        # of a random-weight model's output) and send it with the next token's.
        return self.chunks if self.usage_tokens is None else self.usage_tokens

    @property
    def ttft(self) -> float:
        return self.first - self.sent if self.first is not None else math.inf


async def stream_once(
    client: httpx.AsyncClient, server: Server, prompt: Prompt, max_tokens: int, deadline: float
) -> Stream:
    """POST one streamed request and time its chunks until ``[DONE]`` or ``deadline`` (loop time).

    A pooled connection that the server had closed (llama-server drops idle keep-alive connections)
    fails before anything is sent back: the request is sent once more, on a new connection."""
    result = await _stream_once(client, server, prompt, max_tokens, deadline)
    if result.error and result.error.startswith("RemoteProtocolError") and result.chunks == 0:
        result = await _stream_once(client, server, prompt, max_tokens, deadline)
    return result


async def _stream_once(
    client: httpx.AsyncClient, server: Server, prompt: Prompt, max_tokens: int, deadline: float
) -> Stream:
    result = Stream(sent=time.perf_counter())
    try:
        async with asyncio.timeout_at(deadline):
            body = server.body(prompt, max_tokens, stream=True)
            async with client.stream("POST", server.url, json=body, headers=server.headers) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    result.error = f"HTTP {response.status_code}: {text[:160]}"
                    return result
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        result.done = True
                    elif line.startswith("data: "):
                        _read_chunk(server, result, json.loads(line[6:]), time.perf_counter())
        if result.error is None and not (result.done or not server.sends_done and result.finish_reason):
            result.error = "the stream ended without data: [DONE]"
    except TimeoutError:
        result.cut = True
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


def _read_chunk(server: Server, result: Stream, event: dict[str, Any], now: float) -> None:
    if "error" in event:
        result.error = f"in-band error: {json.dumps(event['error'])[:160]}"
        return
    if event.get("usage"):
        result.usage_tokens = event["usage"].get("completion_tokens")
        result.prompt_tokens = event["usage"].get("prompt_tokens")
    for choice in event.get("choices") or []:
        result.finish_reason = choice.get("finish_reason") or result.finish_reason
        if server.one_chunk_per_token:
            # One chunk per token; only a "stop" by the end-of-sequence token comes without one.
            carries = bool(choice.get("text")) or choice.get("finish_reason") != "stop"
        else:
            carries = bool(choice.get("text"))
        if carries:
            result.chunks += 1
            if result.first is None:
                result.first = now
            else:
                result.max_gap = max(result.max_gap, now - result.last)
            result.last = now


async def post_once(
    client: httpx.AsyncClient, server: Server, prompt: Prompt, deadline: float
) -> tuple[bool, str | None]:
    """One non-streamed ``max_tokens: 1`` request: ``(ok, error)`` (sent again once on a stale connection)."""
    try:
        async with asyncio.timeout_at(deadline):
            body = server.body(prompt, 1, stream=False)
            try:
                response = await client.post(server.url, json=body, headers=server.headers)
            except httpx.RemoteProtocolError:
                response = await client.post(server.url, json=body, headers=server.headers)
    except TimeoutError:
        return False, None
    except httpx.HTTPError as error:
        return False, f"{type(error).__name__}: {error}"
    if response.status_code != 200:
        return False, f"HTTP {response.status_code}: {response.text[:160]}"
    tokens = response.json().get("usage", {}).get("completion_tokens")
    return (True, None) if tokens == 1 else (False, f"completion_tokens {tokens}, not 1")


# --- Prompts ---------------------------------------------------------------------------------------


# A completions prompt: text, or its token ids (OpenAI's and llama-server's array of integers).
Prompt = str | list[int]


class Prompts:
    """Prompts of exactly ``length`` tokens by the model's own tokenizer: random single-token words,
    as text or, ``as_ids``, as their token ids."""

    def __init__(self, tokenizer: Any, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.as_ids = as_ids
        words = []
        for token in tokenizer.get_vocab():
            word = token[1:]
            if token.startswith("Ġ") and word.isascii() and word.isalpha() and word.islower() and 3 <= len(word) <= 8:
                words.append(word)
        words.sort()
        self.words = [
            w for w in random.Random(0).sample(words, 2000) if self.count(" " + w) == 1 and self.count(w) == 1
        ]
        self.reset()

    def reset(self) -> None:
        """Start the sequence of prompts again, so that every server gets the same ones."""
        self._serial = 0

    def fork(self) -> Prompts:
        """The same prompts from the start, counted apart (a server measured beside others)."""
        twin = object.__new__(Prompts)
        twin.tokenizer, twin.words, twin.as_ids = self.tokenizer, self.words, self.as_ids
        twin.reset()
        return twin

    def count(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    def make(self, length: int) -> Prompt:
        """A new prompt (never the same twice in a run) of exactly ``length`` tokens."""
        self._serial += 1
        rng = random.Random(self._serial)
        for _ in range(50):
            words = rng.choices(self.words, k=length)
            text = words[0].capitalize() + "".join(" " + w for w in words[1:])
            if self.count(text) == length:
                return self.tokenizer(text)["input_ids"] if self.as_ids else text
        raise RuntimeError(f"could not build a {length}-token prompt")


# --- Phases ----------------------------------------------------------------------------------------


@dataclass
class Bench:
    """One server's run: its client, sampler, prompts, and the figures gathered so far."""

    server: Server
    client: httpx.AsyncClient
    rss: RssSampler
    prompts: Prompts
    deadlines: dict[str, float]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def deadline(self, phase: str) -> tuple[float, float]:
        """``(seconds, loop-time deadline)`` of ``phase``."""
        seconds = self.deadlines[phase]
        return seconds, asyncio.get_running_loop().time() + seconds


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile; ``inf`` (no first token by the deadline) sorts last."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return xs[lo]
    if math.isinf(xs[hi]):
        return math.inf
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(
    bench: Bench, streams: list[Stream], started: float, seconds: float, expect: int | None, rss: bool = True
) -> dict[str, Any]:
    """The figures of ``streams`` sent from ``started`` on, in a phase of ``seconds``; ``expect``: tokens each."""
    server = bench.server
    ends = [s.last for s in streams if s.last is not None]
    tokens = sum(s.tokens(server) for s in streams)
    wall = (max(ends) - started) if ends else None
    rates = [
        (s.tokens(server) - 1) / (s.last - s.first)
        for s in streams
        if s.first is not None and s.last is not None and s.last > s.first and s.tokens(server) > 1
    ]
    ttfts = [s.ttft for s in streams]
    finished = [s for s in streams if not s.cut and s.error is None]
    mismatched = [s for s in finished if server.one_chunk_per_token and s.usage_tokens != s.chunks]
    short = [s for s in finished if expect is not None and s.tokens(server) != expect]
    errors = sorted({s.error for s in streams if s.error})
    return {
        "requests": len(streams),
        "finished": len(finished),
        "cut_at_deadline": sum(s.cut for s in streams),
        "errors": errors,
        "tokens": tokens,
        "aggregate_tps": tokens / wall if wall else 0.0,
        "per_stream_tps": statistics.mean(rates) if rates else None,
        "ttft_p50_s": _finite(percentile(ttfts, 0.5)),
        "ttft_p95_s": _finite(percentile(ttfts, 0.95)),
        "ttft_censored_at_s": seconds if any(math.isinf(t) for t in ttfts) else None,
        "max_gap_s": max((s.max_gap for s in streams), default=0.0),
        "usage_mismatches": len(mismatched),
        "wrong_token_counts": sorted({s.tokens(server) for s in short}),
        "peak_rss_mb": bench.rss.take_peak() / MB if rss else None,
    }


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else value


async def run_clients(
    bench: Bench, clients: int, per_client: int, prompt_tokens: int, max_tokens: int, deadline: float
) -> list[Stream]:
    """``clients`` concurrent clients, each sending ``per_client`` streamed requests back to back."""
    prompts = [[bench.prompts.make(prompt_tokens) for _ in range(per_client)] for _ in range(clients)]

    async def client(mine: list[Prompt]) -> list[Stream]:
        out = []
        for prompt in mine:
            if asyncio.get_running_loop().time() >= deadline:
                break
            out.append(await stream_once(bench.client, bench.server, prompt, max_tokens, deadline))
        return out

    done = await asyncio.gather(*(client(mine) for mine in prompts))
    return [s for streams in done for s in streams]


async def phase_concurrency(bench: Bench, n: int, per_client: int) -> None:
    seconds, deadline = bench.deadline(f"n{n}")
    bench.rss.take_peak()
    started = time.perf_counter()
    streams = await run_clients(bench, n, per_client, SHORT_PROMPT, NEW_TOKENS, deadline)
    bench.results[f"n{n}"] = summarize(bench, streams, started, seconds, NEW_TOKENS)


async def phase_idle_ttft(bench: Bench, requests: int) -> None:
    seconds, deadline = bench.deadline("idle_ttft")
    bench.rss.take_peak()
    streams = []
    for _ in range(requests):
        streams.append(await stream_once(bench.client, bench.server, bench.prompts.make(LONG_PROMPT), 1, deadline))
        await settle(bench, "a 512-token prompt")
    summary = summarize(bench, streams, streams[0].sent, seconds, 1)
    summary["median_s"] = _finite(statistics.median(s.ttft for s in streams))
    summary["ttfts_s"] = [_finite(s.ttft) for s in streams]
    bench.results["idle_ttft"] = summary


async def phase_load_ttft(bench: Bench, probes: int, interval: float = 0.5, streams: int = 8) -> None:
    """New requests every ``interval`` s while ``streams`` long streams run (restarted as they end)."""
    seconds, deadline = bench.deadline("load_ttft")
    loop = asyncio.get_running_loop()
    bench.rss.take_peak()
    background: list[Stream] = []

    async def keep_streaming() -> None:
        while loop.time() < deadline:
            prompt = bench.prompts.make(SHORT_PROMPT)
            background.append(await stream_once(bench.client, bench.server, prompt, NEW_TOKENS, deadline))

    runners = [asyncio.create_task(keep_streaming()) for _ in range(streams)]
    # Let the streams get going (all of them in the running batch), within a bound.
    ready_by = loop.time() + min(10.0, seconds / 3)
    if bench.server.health_path:
        while loop.time() < ready_by and (await health(bench)).get("running", 0) < streams:
            await asyncio.sleep(0.1)
    else:
        await asyncio.sleep(min(3.0, seconds / 6))
    started = time.perf_counter()
    probe_tasks = []
    for _ in range(probes):
        if loop.time() >= deadline:
            break
        prompt = bench.prompts.make(SHORT_PROMPT)
        probe_tasks.append(asyncio.create_task(stream_once(bench.client, bench.server, prompt, 4, deadline)))
        await asyncio.sleep(interval)
    measured = list(await asyncio.gather(*probe_tasks))
    for runner in runners:  # streams still running are dropped (the disconnect aborts them)
        runner.cancel()
    await asyncio.gather(*runners, return_exceptions=True)
    summary = summarize(bench, measured, started, seconds, 4)
    summary["p95_s"] = summary["ttft_p95_s"]
    summary["background"] = summarize(bench, background, started, seconds, NEW_TOKENS, rss=False)
    bench.results["load_ttft"] = summary


async def phase_context(bench: Bench, streams: int) -> None:
    seconds, deadline = bench.deadline("context")
    bench.rss.take_peak()
    started = time.perf_counter()
    out = await run_clients(bench, streams, 1, CONTEXT_PROMPT, NEW_TOKENS, deadline)
    bench.results["context"] = summarize(bench, out, started, seconds, NEW_TOKENS)


async def phase_rps(bench: Bench, duration: float, prompt_tokens: int, name: str, clients: int = 16) -> None:
    """``clients`` clients sending non-streamed ``max_tokens: 1`` requests of ``prompt_tokens``-token
    prompts for ``duration`` s; the figures go in ``results[name]``."""
    seconds, deadline = bench.deadline("rps")
    loop = asyncio.get_running_loop()
    bench.rss.take_peak()
    prompts = [bench.prompts.make(prompt_tokens) for _ in range(64)]
    cut = 0
    started = time.perf_counter()
    stop_sending = loop.time() + duration
    ok: list[float] = []
    errors: list[str] = []

    async def client(index: int) -> None:
        nonlocal cut
        i = index
        while loop.time() < stop_sending:
            success, error = await post_once(bench.client, bench.server, prompts[i % len(prompts)], deadline)
            i += clients
            if success:
                ok.append(time.perf_counter())
            elif error:
                errors.append(error)
            else:
                cut += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = (max(ok) - started) if ok else None
    bench.results[name] = {
        "deadline_s": seconds,
        "requests": len(ok) + len(errors) + cut,
        "cut_at_deadline": cut,
        "ok": len(ok),
        "errors": sorted(set(errors)),
        "error_count": len(errors),
        "requests_per_s": len(ok) / wall if wall else 0.0,
        "peak_rss_mb": bench.rss.take_peak() / MB,
    }


# --- Scoring, fairness, warm-up (issue 12) ---------------------------------------------------------


SCORING_PROMPT = 160
FAIRNESS_PROMPTS = 64
FAIRNESS_PROMPT = 2000
WARMUP_TOKENS = 32


async def phase_scoring(bench: Bench, requests: int, clients: int = 8) -> None:
    """What lm-evaluation-harness sends for log-likelihoods: ``echo: true, logprobs: 1, max_tokens: 0``
    with 160-token prompts, non-streamed, from ``clients`` clients; requests/s and prompt tokens/s."""
    seconds, deadline = bench.deadline("scoring")
    bench.rss.take_peak()
    queue = [bench.prompts.make(SCORING_PROMPT) for _ in range(requests)]
    ok: list[float] = []
    errors: list[str] = []
    cut = 0
    started = time.perf_counter()

    async def client() -> None:
        nonlocal cut
        while queue:
            body = {
                "model": bench.server.model,
                "prompt": queue.pop(),
                "max_tokens": 0,
                "echo": True,
                "logprobs": 1,
                "temperature": 0,
            }
            try:
                async with asyncio.timeout_at(deadline):
                    response = await bench.client.post(bench.server.url, json=body, headers=bench.server.headers)
            except TimeoutError:
                cut += 1
                continue
            except httpx.HTTPError as error:
                errors.append(f"{type(error).__name__}: {error}")
                continue
            if response.status_code != 200:
                errors.append(f"HTTP {response.status_code}: {response.text[:160]}")
                continue
            data = response.json()
            logprobs = ((data.get("choices") or [{}])[0].get("logprobs") or {}).get("token_logprobs") or []
            if data.get("usage", {}).get("prompt_tokens") != SCORING_PROMPT or len(logprobs) != SCORING_PROMPT:
                errors.append(
                    f"prompt_tokens {data.get('usage', {}).get('prompt_tokens')}, "
                    f"{len(logprobs)} prompt log-probabilities, not {SCORING_PROMPT}"
                )
                continue
            ok.append(time.perf_counter())

    await asyncio.gather(*(client() for _ in range(clients)))
    wall = (max(ok) - started) if ok else None
    bench.results["scoring"] = {
        "deadline_s": seconds,
        "requests": requests,
        "ok": len(ok),
        "cut_at_deadline": cut,
        "errors": sorted(set(errors)),
        "requests_per_s": len(ok) / wall if wall else 0.0,
        "prompt_tps": len(ok) * SCORING_PROMPT / wall if wall else 0.0,
        "peak_rss_mb": bench.rss.take_peak() / MB,
    }


async def phase_fairness(bench: Bench, probes: int = 3, gap: float = 1.0) -> None:
    """Time to first token of short requests (16-token prompts) sent while one streamed request of
    64 prompts x 2,000 tokens is being prefilled; each probe waits at most the phase's deadline, then
    the big request is dropped (the disconnect aborts it)."""
    seconds, _ = bench.deadline("fairness")
    loop = asyncio.get_running_loop()
    big_prompts = [bench.prompts.make(FAIRNESS_PROMPT) for _ in range(FAIRNESS_PROMPTS)]
    body = {**bench.server.body("", 1, stream=True), "prompt": big_prompts}
    big_started = time.perf_counter()
    big_first: list[float] = []

    async def big() -> None:
        async with bench.client.stream("POST", bench.server.url, json=body, headers=bench.server.headers) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: ") and big_first == []:
                    big_first.append(time.perf_counter())

    big_task = asyncio.create_task(big())
    # Let it be admitted and start its prefill.
    until = loop.time() + 5
    while loop.time() < until and (await health(bench)).get("running", 0) < 1:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    measured: list[Stream] = []
    for _ in range(probes):
        if big_task.done():
            break
        deadline = loop.time() + seconds
        measured.append(await stream_once(bench.client, bench.server, bench.prompts.make(SHORT_PROMPT), 4, deadline))
        if measured[-1].cut:  # one wait of the whole cap is enough to know
            break
        await asyncio.sleep(gap)
    big_done = big_task.done()
    big_task.cancel()
    await asyncio.gather(big_task, return_exceptions=True)
    ttfts = [s.ttft for s in measured]
    bench.results["fairness"] = {
        "deadline_s": seconds,
        "requests": len(measured),
        "cut_at_deadline": sum(s.cut for s in measured),
        "errors": sorted({s.error for s in measured if s.error}),
        "probe_ttfts_s": [_finite(t) for t in ttfts],
        "probe_ttft_max_s": _finite(max(ttfts)) if ttfts else None,
        "ttft_censored_at_s": seconds if any(math.isinf(t) for t in ttfts) else None,
        "big_request_finished_first": big_done,
        "big_request_ttft_s": (big_first[0] - big_started) if big_first else None,
    }
    await settle(bench, "the fairness phase's aborted request", limit=60)


async def timed_completions(bench: Bench, count: int) -> list[Stream]:
    """``count`` streamed completions one after another (16-token prompts, 32 tokens), each cut after
    the warm-up phase's deadline."""
    streams = []
    for _ in range(count):
        _, deadline = bench.deadline("warmup")
        streams.append(
            await stream_once(bench.client, bench.server, bench.prompts.make(SHORT_PROMPT), WARMUP_TOKENS, deadline)
        )
    return streams


def warmup_latencies(streams: list[Stream]) -> list[float | None]:
    return [None if s.cut or s.error or s.last is None else s.last - s.sent for s in streams]


async def phase_warmup_first(bench: Bench, count: int = 3) -> None:
    """The first completions right after ``/healthz`` said 200 (before anything else is sent)."""
    streams = await timed_completions(bench, count)
    bench.results["warmup"] = {
        "first_s": warmup_latencies(streams),
        "errors": sorted({s.error for s in streams if s.error}),
    }


async def phase_warmup_late(bench: Bench, count: int = 3) -> None:
    """The same completions after the whole run (the server has answered 100-odd requests by then)."""
    if "warmup" not in bench.results:
        return
    figures = bench.results["warmup"]
    figures["late_s"] = warmup_latencies(await timed_completions(bench, count))
    first = [x for x in figures["first_s"] if x is not None]
    late = [x for x in figures["late_s"] if x is not None]
    figures["first_mean_s"] = statistics.mean(first) if first else None
    figures["late_mean_s"] = statistics.mean(late) if late else None
    figures["ratio"] = (
        figures["first_mean_s"] / figures["late_mean_s"]
        if first and late and len(first) == len(figures["first_s"])
        else None
    )


# --- Contention (issue 12) -------------------------------------------------------------------------

BUSY_LOOP = "while True: pass"


@contextlib.contextmanager
def busy_loops(count: int = 2):
    """``count`` Python processes spinning on the CPU, killed on the way out."""
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield loops
    finally:
        for loop_process in loops:
            loop_process.kill()
        for loop_process in loops:
            loop_process.wait(timeout=10)


async def throughput(
    client: httpx.AsyncClient, server: Server, prompts: Prompts, streams: int, tokens: int, seconds: float
) -> dict[str, Any]:
    """``streams`` concurrent streamed requests of ``tokens`` tokens each, cut after ``seconds``:
    tokens received / time to the last one (or to the cut)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    started = time.perf_counter()
    texts = [prompts.make(SHORT_PROMPT) for _ in range(streams)]
    done = await asyncio.gather(*(stream_once(client, server, text, tokens, deadline) for text in texts))
    received = sum(s.tokens(server) for s in done)
    cut = sum(s.cut for s in done)
    ends = [s.last for s in done if s.last is not None]
    wall = seconds if cut or not ends else max(ends) - started
    return {
        "tps": received / wall if wall else 0.0,
        "tokens": received,
        "cut": cut,
        "errors": sorted({s.error for s in done if s.error}),
    }


def kept(busy: dict[str, Any], quiet: dict[str, Any]) -> float | None:
    return busy["tps"] / quiet["tps"] if quiet.get("tps") else None


async def contention_pair(bench: Bench, seconds: float) -> dict[str, Any]:
    """Tokens/s at 1 stream (64 tokens) and 8 streams (32 tokens each), quiet then beside two busy loops."""
    figures: dict[str, Any] = {}
    for condition in ("quiet", "busy"):
        with busy_loops() if condition == "busy" else contextlib.nullcontext():
            for streams, tokens in ((1, 64), (8, 32)):
                result = await throughput(bench.client, bench.server, bench.prompts, streams, tokens, seconds)
                figures[f"{condition}_{streams}"] = result
        if condition == "quiet":
            await settle(bench, "the quiet contention runs")
    figures["busy_kept_1"] = kept(figures["busy_1"], figures["quiet_1"])
    figures["busy_kept_8"] = kept(figures["busy_8"], figures["quiet_8"])
    return figures


async def phase_contention(bench: Bench, seconds: float, second: Callable[[], Server] | None) -> None:
    """Ours quiet vs beside two busy loops; then, with ``second`` (a starter of another of our servers),
    both servers under 8 streams at once against this one alone (its quiet 8-stream figure)."""
    figures = await contention_pair(bench, seconds)
    await settle(bench, "the busy loops")
    if second is not None:
        other = await asyncio.to_thread(second)
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client:
                await throughput(client, other, bench.prompts, 1, 8, seconds)  # its first request
                both = await asyncio.gather(
                    throughput(bench.client, bench.server, bench.prompts, 8, 32, seconds),
                    throughput(client, other, bench.prompts, 8, 32, seconds),
                )
        finally:
            await asyncio.to_thread(other.stop)
        figures["two_servers_8"] = list(both)
        shares = [kept(result, figures["quiet_8"]) for result in both]
        figures["two_servers_kept"] = min(shares) if None not in shares else None
    figures["deadline_s"] = seconds
    figures["cut_at_deadline"] = 0  # cuts are part of the figure here
    bench.results["contention"] = figures


async def health(bench: Bench) -> dict[str, Any]:
    try:
        response = await bench.client.get(bench.server.base_url + bench.server.health_path, timeout=5)
        return response.json()
    except (httpx.HTTPError, ValueError):
        return {}


async def settle(bench: Bench, after: str, limit: float = 8.0) -> None:
    """Wait until the server is idle: no running or waiting requests (ours), and its CPU quiet."""
    loop = asyncio.get_running_loop()
    until = loop.time() + limit
    process = psutil.Process(bench.server.pid)
    quiet = 0
    while loop.time() < until and quiet < 2:
        busy = False
        if bench.server.health_path:
            stats = await health(bench)
            busy = stats.get("running", 0) + stats.get("waiting", 0) > 0
        process.cpu_percent(None)
        await asyncio.sleep(0.25)
        busy = busy or process.cpu_percent(None) > 25
        quiet = 0 if busy else quiet + 1
    if quiet < 2:
        stats = await health(bench) if bench.server.health_path else {}
        bench.notes.append(f"not idle {limit:.0f} s after {after} {stats or ''}".strip())


async def warm_up(bench: Bench, limit: float = 40.0) -> None:
    """A short and a 512-token request, so that first-call costs stay out of the figures.

    Raises when the server answers wrongly (an error, wrong token counts); running out of time on a
    busy machine is only noted.
    """
    deadline = asyncio.get_running_loop().time() + limit
    for length in (SHORT_PROMPT, LONG_PROMPT):
        result = await stream_once(bench.client, bench.server, bench.prompts.make(length), 8, deadline)
        if result.cut:
            bench.notes.append(f"the warm-up ran out of its {limit:.0f} s")
            return
        if result.error:
            raise RuntimeError(f"{bench.server.name}: the warm-up request failed: {result.error}")
        if bench.server.one_chunk_per_token and result.tokens(bench.server) != 8:
            raise RuntimeError(f"{bench.server.name}: the warm-up made {result.tokens(bench.server)} tokens, not 8")
        if result.prompt_tokens not in (None, length):
            raise RuntimeError(f"{bench.server.name}: a {length}-token prompt counted {result.prompt_tokens} tokens")


# The phases in the order run_server runs them ("start": the first completions and the warm-up);
# "warmup_late" is the warm-up phase's second half.
STEP_ORDER = (
    "start",
    "n1",
    "n8",
    "n32",
    "idle_ttft",
    "load_ttft",
    "context",
    "rps",
    "rps_1",
    "scoring",
    "contention",
    "warmup_late",
    "fairness",
)


def runs_phase(server_name: str, step: str, phases: tuple[str, ...], plan: Plan) -> bool:
    """Whether ``server_name`` runs ``step`` (of :data:`STEP_ORDER`) in a run of ``phases``."""
    if step == "start":
        return True
    if step == "warmup_late":
        step = "warmup"
    if step.startswith("n") and step[1:].isdigit() and int(step[1:]) not in plan.concurrency:
        return False
    if step == "context" and not plan.context_streams:
        return False
    return step in phases and not (step in OURS_ONLY and server_name != "ours")


class Turns:
    """Several servers' phases in turns: each phase runs on one server at a time, the servers
    alternating which goes first from one shared phase to the next (ABBA), so that a ratio compares
    figures taken seconds apart, not minutes apart on a machine whose speed drifts.  ``order``:
    ``(step, server)`` pairs in the order they run; a pair not in it runs whenever it comes."""

    def __init__(self, order: list[tuple[str, str]]) -> None:
        self.order = order
        self._done: set[tuple[str, str]] = set()
        self._left: set[str] = set()  # servers whose run ended (or failed): their turns are skipped
        self._changed = asyncio.Condition()

    @classmethod
    def alternating(cls, servers: list[str], phases: tuple[str, ...], plan: Plan) -> Turns:
        order: list[tuple[str, str]] = []
        first = 0
        for step in STEP_ORDER:
            taking = [name for name in servers if runs_phase(name, step, phases, plan)]
            if len(taking) > 1 and step != "start":
                taking = taking[first:] + taking[:first]
                first = (first + 1) % len(servers)
            order += [(step, name) for name in taking]
        return cls(order)

    def _ready(self, key: tuple[str, str]) -> bool:
        for earlier in self.order[: self.order.index(key)]:
            if earlier not in self._done and earlier[1] not in self._left:
                return False
        return True

    @contextlib.asynccontextmanager
    async def turn(self, step: str, server: str):
        key = (step, server)
        if key in self.order:
            async with self._changed:
                await self._changed.wait_for(lambda: self._ready(key))
        try:
            yield
        finally:
            async with self._changed:
                self._done.add(key)
                self._changed.notify_all()

    async def leave(self, server: str) -> None:
        async with self._changed:
            self._left.add(server)
            self._changed.notify_all()


async def run_server(
    server: Server,
    plan: Plan,
    prompts: Prompts,
    deadlines: dict[str, float],
    phases: tuple[str, ...] = PHASES,
    second: Callable[[], Server] | None = None,
    turns: Turns | None = None,
) -> dict[str, Any]:
    """The ``phases`` of ``plan`` against ``server``; the figures, with notes on anything odd.
    ``second`` starts another server like this one (the contention phase's neighbour); ``turns``
    (several servers measured together) says when each phase may run."""
    turns = turns or Turns([])
    try:
        return await _run_phases(server, plan, prompts, deadlines, phases, second, turns)
    finally:
        await turns.leave(server.name)


async def _run_phases(
    server: Server,
    plan: Plan,
    prompts: Prompts,
    deadlines: dict[str, float],
    phases: tuple[str, ...],
    second: Callable[[], Server] | None,
    turns: Turns,
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        with RssSampler(server.pid) as rss:
            bench = Bench(server, client, rss, prompts.fork(), deadlines)
            started = time.perf_counter()
            async with turns.turn("start", server.name):
                if server.health_path:
                    bench.results["health_start"] = await health(bench)
                if "warmup" in phases:  # first, before anything else reaches the server
                    await phase_warmup_first(bench)
                    print(
                        f"  {server.name}: first {len(bench.results['warmup']['first_s'])} completions after "
                        f"/healthz: {bench.results['warmup']['first_s']}",
                        flush=True,
                    )
                await warm_up(bench, limit=40.0 * DEADLINE_FACTOR)
                await settle(bench, "the warm-up")
            idle_rss = rss.rss() / MB
            steps: dict[str, tuple[str, Callable[[], Any]]] = {
                f"n{n}": (f"N={n}", lambda n=n: phase_concurrency(bench, n, plan.requests_per_client[n]))
                for n in plan.concurrency
            }
            steps["idle_ttft"] = ("TTFT 512 idle", lambda: phase_idle_ttft(bench, plan.idle_ttft_requests))
            steps["load_ttft"] = ("TTFT under load", lambda: phase_load_ttft(bench, plan.probes))
            steps["context"] = ("32x512 contexts", lambda: phase_context(bench, plan.context_streams))
            steps["rps"] = ("req/s", lambda: phase_rps(bench, plan.rps_seconds, SHORT_PROMPT, "rps"))
            steps["rps_1"] = ("req/s, 1-token prompts", lambda: phase_rps(bench, plan.rps_seconds, 1, "rps_1"))
            steps["scoring"] = ("scoring", lambda: phase_scoring(bench, plan.scoring_requests))
            steps["contention"] = ("contention", lambda: phase_contention(bench, plan.contention_seconds, second))
            steps["warmup_late"] = ("warm-up, after the run", lambda: phase_warmup_late(bench))
            # Last: the engine may go on with the big request after its client has gone.
            steps["fairness"] = ("fairness", lambda: phase_fairness(bench))
            for name in STEP_ORDER[1:]:
                if not runs_phase(server.name, name, phases, plan):
                    continue
                label, phase = steps[name]
                async with turns.turn(name, server.name):
                    t0 = time.perf_counter()
                    try:
                        await phase()
                    except Exception as error:  # noqa: BLE001 - the other phases' figures still count
                        bench.notes.append(f"{name}: the phase failed: {type(error).__name__}: {error}"[:600])
                        print(f"  {server.name}: {label} failed: {error!r}"[:300], flush=True)
                    else:
                        print(f"  {server.name}: {label} done in {time.perf_counter() - t0:.1f} s", flush=True)
                    await settle(bench, label)
            final = await health(bench) if server.health_path else {}
            bench.results["idle"] = {
                "rss_start_mb": idle_rss,
                "rss_end_mb": rss.rss() / MB,
                "seconds": time.perf_counter() - started,
                "health_end": final,
            }
    bench.notes.extend(odd_things(bench))
    return {"results": bench.results, "notes": bench.notes}


def odd_things(bench: Bench) -> list[str]:
    """Errors, cut requests, token counts, long stalls and RSS growth seen in the figures."""
    notes = []
    phases = dict(bench.results)
    if "background" in phases.get("load_ttft", {}):
        phases["load_ttft.background"] = phases["load_ttft"]["background"]
    for phase, figures in phases.items():
        if not isinstance(figures, dict) or phase in ("health_start", "idle"):
            continue
        for key, label in (("errors", "errors"), ("wrong_token_counts", "finished with token counts")):
            if figures.get(key):
                notes.append(f"{phase}: {label} {figures[key]}")
        if figures.get("cut_at_deadline") and phase != "load_ttft.background":  # cut by design
            seconds = figures.get("deadline_s") or bench.deadlines[phase.split(".")[0]]
            notes.append(
                f"{phase}: {figures['cut_at_deadline']} of {figures['requests']} requests cut at the "
                f"{seconds:.0f} s deadline"
            )
        if figures.get("usage_mismatches"):
            notes.append(f"{phase}: {figures['usage_mismatches']} streams whose chunk count differs from usage")
        if figures.get("max_gap_s", 0) > 1.0:
            notes.append(f"{phase}: a stream waited {figures['max_gap_s']:.1f} s between two tokens")
    idle = bench.results.get("idle", {})
    if idle and idle["rss_end_mb"] - idle["rss_start_mb"] > 100:
        notes.append(f"RSS at idle grew from {idle['rss_start_mb']:.0f} MB to {idle['rss_end_mb']:.0f} MB over the run")
    stats = idle.get("health_end") or {}
    if stats.get("running") or stats.get("waiting"):
        notes.append(f"after the run /healthz still shows {stats}")
    if bench.server.log is not None and bench.server.log.exists():
        text = bench.server.log.read_text(errors="replace")
        bad = [
            line
            for line in text.splitlines()
            if ("Traceback" in line or " ERROR " in line or "Exception" in line)
            and "Service Unavailable: /healthz" not in line
        ]  # polled while the model loads
        if bad:
            notes.append(f"server log: {len(bad)} error lines, first: {bad[0][:200]}")
    return notes


# --- The table -------------------------------------------------------------------------------------

# (label, key, unit format, lower is better)
ROWS = [
    ("aggregate tok/s, N={n}", "n{n}.aggregate_tps", "{:.1f}", False),
    ("per-stream tok/s (mean), N={n}", "n{n}.per_stream_tps", "{:.1f}", False),
    ("TTFT p50 s, N={n}", "n{n}.ttft_p50_s", "{:.3f}", True),
    ("TTFT p95 s, N={n}", "n{n}.ttft_p95_s", "{:.3f}", True),
    ("peak RSS MB, N={n}", "n{n}.peak_rss_mb", "{:.0f}", True),
]
EXTRA_ROWS = [
    ("TTFT 512-token prompt, idle (median of 3) s", "idle_ttft.median_s", "{:.3f}", True),
    ("TTFT p95 s, new requests while 8 stream", "load_ttft.p95_s", "{:.3f}", True),
    ("peak RSS MB, 32 streams x 512-token contexts", "context.peak_rss_mb", "{:.0f}", True),
    ("aggregate tok/s, 32 x 512-token contexts", "context.aggregate_tps", "{:.1f}", False),
    ("req/s, max_tokens 1, 16 clients", "rps.requests_per_s", "{:.1f}", False),
    ("req/s, max_tokens 1, 16 clients, 1-token prompts", "rps_1.requests_per_s", "{:.1f}", False),
    ("scoring req/s (64 x 160 tokens, echo+logprobs)", "scoring.requests_per_s", "{:.2f}", False),
    ("scoring prompt tok/s", "scoring.prompt_tps", "{:.0f}", False),
    ("fairness: short TTFT s (max) beside 64 x 2000", "fairness.probe_ttft_max_s", "{:.3f}", True),
    ("warm-up: first 3 completions, mean s", "warmup.first_mean_s", "{:.3f}", True),
    ("warm-up: 3 completions after the run, mean s", "warmup.late_mean_s", "{:.3f}", True),
    ("contention: tok/s 1 stream, quiet", "contention.quiet_1.tps", "{:.1f}", False),
    ("contention: tok/s 1 stream, 2 busy loops", "contention.busy_1.tps", "{:.1f}", False),
    ("contention: tok/s 8 streams, quiet", "contention.quiet_8.tps", "{:.1f}", False),
    ("contention: tok/s 8 streams, 2 busy loops", "contention.busy_8.tps", "{:.1f}", False),
    ("contention: kept as one of 2 servers (min)", "contention.two_servers_kept", "{:.2f}", False),
]


def lookup(results: dict[str, Any], key: str) -> tuple[float | None, float | None]:
    """``(value, censored_at)``: a TTFT that is None with ``censored_at`` set means ``> censored_at`` s."""
    phase, *path = key.split(".")
    figures = results.get(phase) or {}
    value: Any = figures
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    is_ttft = "ttft" in key
    return value, figures.get("ttft_censored_at_s") if value is None and is_ttft else None


def cell(value: float | None, censored: float | None, fmt: str) -> str:
    if value is not None:
        return fmt.format(value)
    return f">{censored:.0f}" if censored else "-"


def ratio(ours: tuple[float | None, float | None], theirs: tuple[float | None, float | None]) -> str:
    (a, _), (b, b_censored) = ours, theirs
    if a is None:
        return "-"
    if b is None:
        return f"<{a / b_censored:.3f}x" if b_censored else "-"
    return f"{a / b:.2f}x" if b else "-"


def goal_row(goal: Goal, ours: dict[str, Any], other: dict[str, Any] | None) -> tuple[str, str, str, str]:
    """``(ours, other, ratio, met)`` cells of ``goal``; ``other`` is llama-server's or the baseline's results
    (None: not measured).  A figure censored at a deadline bounds the ratio on one side; ``?`` when that
    bound does not decide the goal; ``*`` when some requests of the phase were cut."""
    fmt = (
        "{:.0f}"
        if "rss" in goal.key
        else "{:.3f}"
        if ("ttft" in goal.key or "kept" in goal.key or "ratio" in goal.key)
        else "{:.1f}"
    )
    mine = lookup(ours, goal.key)
    mine_cell = cell(*mine, fmt)
    cut = "*" if (ours.get(goal.key.split(".")[0]) or {}).get("cut_at_deadline") else ""
    if goal.against is None:
        value, censored = mine
        met = goal.met(value)
        if met is None and censored is not None and goal.op != ">=":
            met = False  # more than the deadline
        return mine_cell, "", "", {True: "met", False: "NOT MET", None: "-"}[met] + cut
    if other is None:
        why = "no llama-server" if goal.against == "llama-server" else "no --baseline"
        return mine_cell, "-", "-", f"n/a ({why})"
    theirs = lookup(other, goal.key)
    (a, a_cut), (b, b_cut) = mine, theirs
    figure: float | None = None
    text = "-"
    met: bool | None = None
    if a is not None and b:
        figure = a / b
        text = f"{figure:.2f}"
        met = goal.met(figure)
    elif a is None and a_cut and b:  # ours more than a_cut: the ratio is more than a_cut / b
        text = f">{a_cut / b:.2f}"
        met = False if goal.op != ">=" and not goal.met(a_cut / b) else None
    elif a is not None and b is None and b_cut:  # theirs more than b_cut: the ratio is less
        text = f"<{a / b_cut:.2f}"
        met = True if goal.op != ">=" and goal.met(a / b_cut) else None
    return mine_cell, cell(*theirs, fmt), text, {True: "met", False: "NOT MET", None: "?"}[met] + cut


def goals_table(report: dict[str, Any]) -> str:
    """Issue 12's goals, one line each: our figure, llama-server's (or the baseline's), the ratio, met or not."""
    servers = report["servers"]
    ours = servers.get("ours", {}).get("results", {})
    llama = servers.get("llama-server", {}).get("results") or None
    baseline = report.get("baseline_results")
    head = f"{'goal (issue 12)':50} {'ours':>9} {'llama/base':>10} {'ratio':>7} {'goal':>16} {'':>8}"
    lines = [head, "-" * len(head)]
    for goal in GOALS:
        phase = goal.key.split(".")[0]
        if phase not in ours:
            lines.append(f"{goal.label:50} {'-':>9} {'':>10} {'':>7} {goal.text:>16} not run")
            continue
        other = llama if goal.against == "llama-server" else baseline if goal.against == "baseline" else None
        mine, theirs, ratio_text, met = goal_row(goal, ours, other)
        lines.append(f"{goal.label:50} {mine:>9} {theirs:>10} {ratio_text:>7} {goal.text:>16} {met}")
    return "\n".join(lines)


def table(report: dict[str, Any], plan: Plan) -> str:
    servers = report["servers"]
    ours = servers.get("ours", {}).get("results", {})
    peers = [name for name in servers if name != "ours"]
    rows = [(label.format(n=n), key.format(n=n), fmt, low) for n in plan.concurrency for label, key, fmt, low in ROWS]
    rows += [row for row in EXTRA_ROWS if not (row[1].startswith("context") and not plan.context_streams)]
    rows = [
        row for row in rows if any(row[1].split(".")[0] in (servers[name].get("results") or {}) for name in servers)
    ]
    head = f"{'figure':48} {'ours':>9}"
    for peer in peers:
        head += f" {peer:>13} {'ours/' + peer[:6]:>12}"
    lines = [head, "-" * len(head)]
    for label, key, fmt, _low in rows:
        mine = lookup(ours, key)
        line = f"{label:48} {cell(*mine, fmt):>9}"
        for peer in peers:
            theirs = lookup(servers[peer].get("results", {}), key)
            line += f" {cell(*theirs, fmt):>13} {ratio(mine, theirs):>12}"
        lines.append(line)
    return "\n".join(lines)


# --- Main ------------------------------------------------------------------------------------------


CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")
THREAD_ENV = (
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OMP_NUM_THREADS",
    "ENGINE_NUM_THREADS",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "MODEL_WEIGHTS",
    "MODEL_DTYPE",
)


def cpu_info() -> dict[str, Any]:
    """The CPU's model name, the flags that matter here, and what torch makes of them."""
    model, flags = platform.processor() or "?", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    import torch

    return {
        "model": model,
        "flags": {flag: flag in flags for flag in CPU_FLAGS},
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "env": {name: os.environ[name] for name in THREAD_ENV if name in os.environ},
    }


def find_llama_server() -> str | None:
    """``LLAMA_SERVER``, else the one ``bench/build_llama_server.sh`` built under ``.cache/``, else ``PATH``'s."""
    if os.environ.get("LLAMA_SERVER"):
        return os.environ["LLAMA_SERVER"]
    built = sorted((ROOT / ".cache" / "llama.cpp").glob("build-*/bin/llama-server"))
    return str(built[-1]) if built else shutil.which("llama-server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1 and 8 only, fewer requests, no 32 x 512 phase")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every figure to PATH")
    parser.add_argument("--no-peers", action="store_true", help="measure our server only")
    parser.add_argument(
        "--servers",
        default="ours,transformers,llama-server",
        help="comma-separated, from ours,transformers,llama-server (default: all three)",
    )
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, from {','.join(PHASES)} (default: all)"
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="one server at a time, all its phases, as before (default: every server started, the phases in turns)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        metavar="GGUF",
        help="a GGUF file with the embedded model's tokenizer (bench/make_models.py's) that ours and "
        "llama-server serve instead of the embedded model (transformers is then left out)",
    )
    parser.add_argument(
        "--deadline-factor",
        type=float,
        default=1.0,
        metavar="F",
        help="every phase's deadline times F (an 8B model's streams need several times the embedded one's)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="JSON",
        help="an earlier --json of this machine: the scoring goal is a multiple of its figure",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    phases = tuple(name.strip() for name in args.phases.split(",") if name.strip())
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    plan = Plan(**{**plan.__dict__, "concurrency": tuple(n for n in plan.concurrency if f"n{n}" in phases)})
    global DEADLINE_FACTOR
    DEADLINE_FACTOR = args.deadline_factor
    if args.deadline_factor != 1.0:  # a bigger model's phases take longer than the embedded one's
        plan = Plan(
            **{
                **plan.__dict__,
                "deadlines": {name: seconds * args.deadline_factor for name, seconds in plan.deadlines.items()},
                "peer_deadlines": {
                    name: seconds * args.deadline_factor for name, seconds in plan.peer_deadlines.items()
                },
            }
        )
    if "context" not in phases:
        plan = Plan(**{**plan.__dict__, "context_streams": 0})
    # A SIGTERM (a CI timeout, say) unwinds like Ctrl-C so that every server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    global MODEL_FILE
    if args.model is not None:
        if not args.model.is_file():
            parser.error(f"--model {args.model}: no such file (bench/make_models.py makes them)")
        MODEL_FILE = args.model.resolve()
        args.servers = ",".join(name for name in args.servers.split(",") if name.strip() != "transformers")
    started = time.perf_counter()
    load_start = os.getloadavg()
    from transformers import AutoTokenizer
    from transformers import __version__ as transformers_version

    folder = converted_gguf_dir(embedded_gguf_path(), ROOT / ".cache" / "models")
    prompts = Prompts(AutoTokenizer.from_pretrained(folder), as_ids=MODEL_FILE is not None)
    cpu = cpu_info()
    print(cpu_line(cpu), flush=True)
    report: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "model": str(MODEL_FILE or embedded_gguf_path()),
        "phases": list(phases),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_start": load_start,
            "cpu": cpu,
        },
        "transformers": transformers_version,
        "servers": {},
        "skipped": [],
    }
    if args.baseline:
        report["baseline"] = str(args.baseline)
        report["baseline_results"] = json.loads(args.baseline.read_text())["servers"]["ours"]["results"]
    wanted = {name.strip() for name in args.servers.split(",")} - (
        {"transformers", "llama-server"} if args.no_peers else set()
    )
    starters: list[tuple[str, Callable[[Path], Server]]] = [("ours", start_ours)] if "ours" in wanted else []
    if "transformers" in wanted:
        starters.append(("transformers", lambda d: start_transformers(d, folder)))
    if "llama-server" in wanted:
        binary = find_llama_server()
        if binary:
            report["llama_server"] = binary
            starters.append(("llama-server", lambda d: start_llama_server(d, binary)))
        else:
            report["skipped"].append(
                "llama-server: not built (bench/build_llama_server.sh), not on PATH, LLAMA_SERVER unset"
            )
    report["interleaved"] = not args.sequential
    try:
        with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:

            def neighbour_of(name: str) -> Callable[[], Server] | None:
                if name != "ours":
                    return None
                neighbour = Path(tmp) / "ours-neighbour"
                return lambda: (neighbour.mkdir(exist_ok=True), start_ours(neighbour))[1]

            if args.sequential:
                for name, start in starters:
                    print(f"starting {name} (load average {load_text(os.getloadavg())}) ...", flush=True)
                    report["servers"][name] = measure(
                        name, start, Path(tmp) / name, plan, prompts, phases, neighbour_of(name)
                    )
            else:
                report["servers"] = measure_together(starters, Path(tmp), plan, prompts, phases, neighbour_of)
    finally:
        stop_children()
    report["machine"]["load_average_end"] = os.getloadavg()
    report["seconds"] = time.perf_counter() - started
    print()
    print(render(report, plan))
    if args.json:
        report.pop("baseline_results", None)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def load_text(load: tuple[float, ...] | list[float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def cpu_line(cpu: dict[str, Any]) -> str:
    flags = " ".join(f"{name}{'+' if present else '-'}" for name, present in cpu["flags"].items())
    env = " ".join(f"{k}={v}" for k, v in cpu["env"].items()) or "none set"
    return (
        f"CPU: {cpu['model']}; {flags}; torch {cpu['torch']} capability {cpu['torch_capability']}, "
        f"{cpu['torch_threads']} threads; thread/ISA env: {env}"
    )


def stop_children() -> None:
    """Stop any server this process started and did not stop (an interrupted start, say)."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


def start_one(name: str, start: Callable[[Path], Server], directory: Path) -> tuple[Server | None, dict[str, Any]]:
    """Start a server in ``directory``: it and its outcome so far (the start-up time, or why it did not start)."""
    directory.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    try:
        server = start(directory)
    except Exception as error:  # noqa: BLE001 - a peer that does not start is reported, not fatal
        return None, {"results": {}, "notes": [f"did not start: {error}"[:600]]}
    return server, {"startup_s": time.perf_counter() - t0}


async def run_noted(
    server: Server,
    plan: Plan,
    prompts: Prompts,
    phases: tuple[str, ...],
    second: Callable[[], Server] | None,
    turns: Turns | None = None,
) -> dict[str, Any]:
    """run_server with the server's deadlines; a failure is noted, not raised."""
    deadlines = plan.deadlines if server.name == "ours" else plan.peer_deadlines
    try:
        return await run_server(server, plan, prompts, deadlines, phases, second, turns)
    except Exception as error:  # noqa: BLE001
        return {"results": {}, "notes": [f"the run failed: {type(error).__name__}: {error}"[:600]]}


def measure(
    name: str,
    start: Callable[[Path], Server],
    directory: Path,
    plan: Plan,
    prompts: Prompts,
    phases: tuple[str, ...] = PHASES,
    second: Callable[[], Server] | None = None,
) -> dict[str, Any]:
    """Start the server, run every phase, stop it whatever happens (``--sequential``)."""
    server, outcome = start_one(name, start, directory)
    if server is None:
        return outcome
    try:
        return {**asyncio.run(run_noted(server, plan, prompts, phases, second)), **outcome}
    finally:
        server.stop()


def wait_idle(pids: list[int], limit: float = 30.0) -> None:
    """Wait (up to ``limit`` s) until the processes ``pids`` use under a quarter of a core each, twice in a
    row a quarter of a second apart: a server's first figures must not share the cores with another's start."""
    processes = [psutil.Process(pid) for pid in pids]
    until, quiet = time.monotonic() + limit, 0
    while time.monotonic() < until and quiet < 2:
        for process in processes:
            process.cpu_percent(None)
        time.sleep(0.25)
        quiet = quiet + 1 if all(process.cpu_percent(None) < 25 for process in processes) else 0


def measure_together(
    starters: list[tuple[str, Callable[[Path], Server]]],
    tmp: Path,
    plan: Plan,
    prompts: Prompts,
    phases: tuple[str, ...],
    neighbour_of: Callable[[str], Callable[[], Server] | None],
) -> dict[str, dict[str, Any]]:
    """Start every server, then run their phases in :class:`Turns`, one server at a time while the
    others idle; stop them all.  The first of ``starters`` (ours) starts last, once the others are
    idle, and takes the first turn: its first completions come right after its ``/healthz`` said 200
    (the warm-up goal; after a few idle seconds a first completion took 10-40% longer here)."""
    servers: dict[str, Server] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    try:
        for name, start in starters[1:] + starters[:1]:
            if name == starters[0][0]:
                wait_idle([server.pid for server in servers.values()])  # a peer that just started may still be busy
            print(f"starting {name} (load average {load_text(os.getloadavg())}) ...", flush=True)
            server, outcomes[name] = start_one(name, start, tmp / name)
            if server is not None:
                servers[name] = server
        turns = Turns.alternating([name for name, _ in starters if name in servers], phases, plan)

        async def run_all() -> list[dict[str, Any]]:
            return await asyncio.gather(
                *(
                    run_noted(server, plan, prompts, phases, neighbour_of(name), turns)
                    for name, server in servers.items()
                )
            )

        for name, outcome in zip(servers, asyncio.run(run_all())):
            outcomes[name] = {**outcome, **outcomes[name]}
    finally:
        for server in servers.values():
            server.stop()
    return outcomes


def render(report: dict[str, Any], plan: Plan) -> str:
    machine = report["machine"]
    cpu = machine["cpu"]
    ours = report["servers"].get("ours", {}).get("results", {})
    health_start = ours.get("health_start") or {}
    lines = [
        f"Serving benchmark ({report['mode']}): {Path(report['model']).name} on {machine['cpus']} cores; load average "
        f"{load_text(machine['load_average_start'])} at the start, {load_text(machine['load_average_end'])} "
        f"at the end; {report['seconds']:.0f} s in all",
        cpu_line(cpu),
        f"our engine: runner {health_start.get('runner', 'n/a')}, weights {health_start.get('weights', 'n/a')} "
        "(from /healthz)",
        f"16-token prompts, {NEW_TOKENS} new tokens, temperature 0, stop tokens suppressed; transformers "
        f"{report['transformers']} serve runs one request at a time.",
        "'>X': a request had no first token by the X s deadline of its phase; '*': some requests of that phase "
        "were cut at its deadline.",
        "ours/peer: above 1 is better for tok/s and req/s, below 1 for TTFT and RSS. MB = 10^6 bytes.",
        "",
        table(report, plan),
        "",
        goals_table(report),
    ]
    busiest = max(machine["load_average_start"][0], machine["load_average_end"][0])
    if busiest > machine["cpus"]:
        lines.append(
            f"WARNING: load average {busiest:.1f} on {machine['cpus']} cores: other programs shared the CPU, "
            "and a server whose threads spin (llama-server's, libgomp's by default) slows far more than "
            "one whose threads sleep; these ratios are not the quiet-machine comparison the goals mean."
        )
    if report.get("baseline"):
        lines.append(f"baseline: {report['baseline']}")
    contention = ours.get("contention")
    if contention:
        parts = [
            f"{key} {contention[key]['tps']:.1f} tok/s"
            + (f" ({contention[key]['cut']} cut)" if contention[key]["cut"] else "")
            for key in ("quiet_1", "busy_1", "quiet_8", "busy_8")
            if key in contention
        ]
        both = contention.get("two_servers_8")
        if both:
            parts.append("two servers at 8 streams each " + " + ".join(f"{r['tps']:.1f}" for r in both) + " tok/s")
        lines += ["", "contention: " + "; ".join(parts)]
    fairness = ours.get("fairness")
    if fairness:
        lines.append(
            f"fairness: probe TTFTs {fairness['probe_ttfts_s']} s (cap {fairness['deadline_s']:.0f} s), "
            f"the big request finished first: {fairness['big_request_finished_first']}"
        )
    warmup = ours.get("warmup")
    if warmup:
        lines.append(
            f"warm-up: first {warmup.get('first_s')} s, after the run {warmup.get('late_s')} s "
            f"({WARMUP_TOKENS} tokens each)"
        )
    for name, outcome in report["servers"].items():
        idle = outcome.get("results", {}).get("idle")
        head = f"{name}: started in {outcome.get('startup_s', 0):.1f} s"
        if idle:
            head += f", idle RSS {idle['rss_start_mb']:.0f} MB before the phases, {idle['rss_end_mb']:.0f} MB after"
        lines += ["", head]
        lines += [f"  - {note}" for note in outcome.get("notes", [])] or ["  - nothing odd"]
    lines += [f"skipped {item}" for item in report["skipped"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
