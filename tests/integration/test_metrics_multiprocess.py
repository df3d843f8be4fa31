"""With PROMETHEUS_MULTIPROC_DIR, ``GET /metrics`` of any process sums every process's metrics.

Each step runs in a fresh interpreter: prometheus-client picks its storage (memory or mmapped files)
when it is first imported, from the environment, as a server process does at its start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import django
django.setup()
from completions_site.metrics import forget_live_gauges_at_exit
from inference import metrics as m
if {exits_cleanly}:
    forget_live_gauges_at_exit()
m.generation_tokens.labels(model_name="small").inc({tokens})
m.requests_running.labels(model_name="small").set({running})
"""

SCRAPER = """
import django
django.setup()
from django.test import Client
from inference import metrics  # noqa: F401
print(Client(REMOTE_ADDR="127.0.0.1", HTTP_HOST="127.0.0.1").get("/metrics").content.decode())
"""


def run(code: str, directory: Path) -> str:
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "DJANGO_SETTINGS_MODULE": "completions_site.settings",
        "ENGINE_AUTOSTART": "false",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout


def sample(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_a_starting_process_forgets_the_live_gauges_of_processes_that_died_without_cleaning_up(tmp_path):
    run(WORKER.format(tokens=5, running=2, exits_cleanly=False), tmp_path)  # killed: its files stay
    run(WORKER.format(tokens=7, running=3, exits_cleanly=True), tmp_path)  # its successor: starts, stops (atexit)

    text = run(SCRAPER, tmp_path)

    assert sample(text, "completions_generation_tokens_total") == 12  # counters keep a stopped process's
    assert sample(text, "completions_num_requests_running") == 0  # neither's live gauges stay in the sum
