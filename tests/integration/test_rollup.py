"""The daily rollup: per key, model and UTC day, written with each record, and rebuilt exactly from them."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from io import StringIO
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command

from keys.models import ROLLUP_FIELDS, DailyUsage, ModelPrice, UsageRecord
from keys.usage import record_usage
from tests.inprocess_api import MODEL, body, post

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DAY = datetime(2026, 11, 3, 12, 0, tzinfo=dt_timezone.utc)


def record(api_key, request_id: str, **fields) -> UsageRecord:
    base = dict(request_id=request_id, api_key=api_key, model="m", status_code=200, latency_ms=10.4, created_at=DAY)
    return async_to_sync(record_usage)(**{**base, **fields})


def rollup() -> dict[tuple, dict[str, int]]:
    return {
        (row.api_key_id, row.model, row.day): {name: getattr(row, name) for name in ROLLUP_FIELDS}
        for row in DailyUsage.objects.all()
    }


def test_each_record_adds_to_its_days_row(valid_key):
    ModelPrice.objects.create(model="m", prompt_per_million=1, completion_per_million=2)  # 1000, 2000 nanos a token
    key = valid_key.api_key
    record(key, "a", prompt_tokens=5, completion_tokens=7, latency_ms=10.4, time_to_first_token_ms=2.6)
    record(key, "b", status_code=400, latency_ms=1.5)
    record(key, "c", status_code=429, latency_ms=0.4)
    record(key, "d", status_code=500, prompt_tokens=3, completion_tokens=1, latency_ms=3.0)

    assert rollup() == {
        (key.pk, "m", DAY.date()): {
            "requests": 4,
            "errors": 2,
            "rate_limited": 1,
            "prompt_tokens": 8,
            "completion_tokens": 8,
            "cost_nanos": (5 * 1000 + 7 * 2000) + (3 * 1000 + 1 * 2000),
            "latency_ms_sum": 10 + 2 + 0 + 3,
            "first_token_requests": 1,
            "time_to_first_token_ms_sum": 3,
        }
    }


def test_rows_are_per_key_model_and_utc_day(valid_key, other_users_key):
    record(valid_key.api_key, "a")
    record(valid_key.api_key, "b", model="n")
    record(valid_key.api_key, "c", created_at=DAY.replace(hour=23, minute=59) + timedelta(minutes=2))
    record(other_users_key.api_key, "d")

    assert sorted((k[0], k[1], k[2].isoformat()) for k in rollup()) == sorted(
        [
            (valid_key.api_key.pk, "m", "2026-11-03"),
            (valid_key.api_key.pk, "n", "2026-11-03"),
            (valid_key.api_key.pk, "m", "2026-11-04"),
            (other_users_key.api_key.pk, "m", "2026-11-03"),
        ]
    )


def test_a_record_written_twice_is_counted_once(valid_key):
    record(valid_key.api_key, "cmpl-once", prompt_tokens=5)

    record(valid_key.api_key, "cmpl-once", prompt_tokens=5)  # delivered again (a lost acknowledgement)

    assert UsageRecord.objects.count() == 1
    assert DailyUsage.objects.get().requests == 1
    assert DailyUsage.objects.get().prompt_tokens == 5


def test_a_record_without_a_key_is_not_rolled_up():
    async_to_sync(record_usage)(request_id="x", model="m", status_code=401, latency_ms=1.0)

    assert not DailyUsage.objects.exists()


def test_the_rebuild_reproduces_the_rollup_exactly(valid_key, other_users_key):
    for i in range(30):
        key = (valid_key, other_users_key)[i % 2].api_key
        record(
            key,
            f"r{i}",
            model="mn"[i % 3 == 0],
            status_code=(200, 400, 429, 499)[i % 4],
            prompt_tokens=i,
            completion_tokens=i * 2 % 7,
            latency_ms=i * 1.37 + 0.5,
            time_to_first_token_ms=None if i % 5 == 0 else i * 0.71,
            created_at=DAY + timedelta(hours=i),
        )
    written = rollup()
    DailyUsage.objects.all().delete()

    output = StringIO()
    call_command("rebuild_usage_rollup", stdout=output)

    assert rollup() == written
    assert f"Rebuilt {len(written)} daily usage rows" in output.getvalue()


def test_a_rebuild_of_some_days_leaves_the_other_days_alone(valid_key):
    key = valid_key.api_key
    record(key, "day1", prompt_tokens=1)
    record(key, "day2", prompt_tokens=2, created_at=DAY + timedelta(days=1))
    DailyUsage.objects.update(prompt_tokens=99)  # both rows wrong

    call_command("rebuild_usage_rollup", "--from", "2026-11-04", "--to", "2026-11-04", stdout=StringIO())

    tokens = dict(DailyUsage.objects.values_list("day", "prompt_tokens"))
    assert tokens == {DAY.date(): 99, DAY.date() + timedelta(days=1): 2}


def test_the_rollup_follows_requests_through_the_api(tiny_api, limited_key):
    replies = [
        post(limited_key.plaintext, body()),
        post(limited_key.plaintext, body(stream=True)),
        post(limited_key.plaintext, body(temperature=9)),
        post(limited_key.plaintext, body()),
        post(limited_key.plaintext, body()),  # the fourth admitted in a minute: 429
    ]

    assert [r.status for r in replies] == [200, 200, 400, 200, 429]
    rows = DailyUsage.objects.filter(api_key=limited_key.api_key)
    assert {row.model for row in rows} == {MODEL, ""}  # the 400 was refused before its model was known
    totals = {name: sum(getattr(row, name) for row in rows) for name in ROLLUP_FIELDS}
    assert (totals["requests"], totals["errors"], totals["rate_limited"]) == (5, 1, 1)
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (15, 12)
    records = UsageRecord.objects.filter(api_key=limited_key.api_key)
    assert totals["latency_ms_sum"] == sum(round(r.latency_ms) for r in records)


MANAGE = [sys.executable, str(ROOT / "manage.py")]
WRITER = """
import asyncio, sys
from keys.models import APIKey
from keys.usage import record_usage

async def write(worker):
    key = await APIKey.objects.aget()
    for i in range(25):
        await record_usage(request_id=f"cmpl-{worker}-{i}", api_key=key, model="m", status_code=200,
                           latency_ms=1.0, prompt_tokens=1, completion_tokens=2)

asyncio.run(write({worker}))
"""


def test_concurrent_writers_in_several_processes_lose_no_record_and_no_increment(tmp_path):
    """SQLite (the default) under concurrent writers: WAL and the busy timeout make them wait their turn."""
    env = {**__import__("os").environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    run = lambda *args: subprocess.run([*MANAGE, *args], env=env, cwd=ROOT, check=True, capture_output=True)  # noqa: E731
    run("migrate", "-v", "0")
    run("shell", "-v", "0", "-c", "from django.contrib.auth.models import User; User.objects.create_user('w')")
    run("create_api_key", "--name", "w", "--user", "w")

    writers = [
        subprocess.Popen(
            [*MANAGE, "shell", "-v", "0", "-c", WRITER.replace("{worker}", str(n))],
            env=env,
            cwd=ROOT,
            stderr=subprocess.PIPE,
        )
        for n in range(4)
    ]
    errors = [w.communicate(timeout=120)[1].decode() for w in writers]

    assert [w.returncode for w in writers] == [0] * 4, errors
    counts = run(
        "shell",
        "-v",
        "0",
        "-c",
        "from keys.models import DailyUsage as D, UsageRecord as U; "
        "r = D.objects.get(); print(U.objects.count(), r.requests, r.prompt_tokens, r.completion_tokens)",
    )
    assert counts.stdout.decode().split() == ["100", "100", "100", "200"]
