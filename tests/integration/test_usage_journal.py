"""The usage journal: a record the database did not take waits on disk and is written once, later.

The database's failures are simulated by making :func:`keys.usage.write_record` raise
``OperationalError`` (what Django raises for a database that is down or restarting); the journal's
own by a connection that raises SQLite's "database or disk is full".  Requests go through the real
views on the tiny model; the flusher thread is not running, so tests flush by hand.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError
from django.test import AsyncClient
from prometheus_client import REGISTRY

from keys import journal as journal_module
from keys.db import database_health, db_call
from keys.journal import Journal, database_digest, get_journal
from keys.models import DailyUsage, UsageRecord
from keys.usage import prepare_fields
from tests.inprocess_api import body, open_stream, post, tokens_in

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


class DatabaseDown:
    """``write_record`` failing ``times`` times as a database that does not answer, then working."""

    def __init__(self, monkeypatch, times: int = 10**9) -> None:
        self.left = times
        self.real = journal_module.write_record
        monkeypatch.setattr(journal_module, "write_record", self)

    def __call__(self, fields):
        if self.left > 0:
            self.left -= 1
            raise OperationalError("connection to server at 127.0.0.1, port 5432 failed: Connection refused")
        return self.real(fields)


class FullDisk:
    """Stands in for the journal's SQLite connection on a full disk: every statement fails."""

    def execute(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self):
        pass


def in_flight(journal: Journal) -> dict[str, dict]:
    """The journal's provisional records (of streams still running), by ``request_id``."""
    with sqlite3.connect(journal.path) as db:
        return {request_id: json.loads(text) for request_id, text in db.execute("SELECT * FROM in_flight")}


def healthz() -> tuple[int, dict]:
    response = async_to_sync(AsyncClient().get)("/healthz")
    return response.status_code, json.loads(response.content)


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def fields(request_id: str, api_key, **extra) -> dict:
    return prepare_fields(
        {
            "request_id": request_id,
            "api_key": api_key,
            "model": "tiny",
            "status_code": 200,
            "latency_ms": 12.0,
            "prompt_tokens": 5,
            "completion_tokens": 4,
            **extra,
        }
    )


def test_a_record_the_database_did_not_take_waits_in_the_journal_and_is_written_once_later(
    tiny_api, valid_key, monkeypatch
):
    down = DatabaseDown(monkeypatch, times=1)
    failures = sample("completions_usage_record_write_failures_total")

    served = post(valid_key.plaintext, body())

    assert served.status == 200  # the client got its answer; its record waits on disk
    assert not UsageRecord.objects.exists()
    assert get_journal().records == 1 and sample("completions_usage_journal_records") == 1
    assert sample("completions_usage_record_write_failures_total") == failures + 1
    assert down.left == 0

    assert get_journal().flush() == 1
    get_journal().flush()  # nothing left: nothing written twice

    record = UsageRecord.objects.get()
    assert (record.request_id, record.prompt_tokens, record.completion_tokens) == (served.request_id, 5, 4)
    assert DailyUsage.objects.get().requests == 1 and DailyUsage.objects.get().completion_tokens == 4
    assert get_journal().records == 0 and sample("completions_usage_journal_records") == 0


def test_records_wait_behind_older_ones_and_are_written_in_order(tiny_api, valid_key, monkeypatch):
    DatabaseDown(monkeypatch, times=1)

    first = post(valid_key.plaintext, body())
    second = post(valid_key.plaintext, body())  # the database answers now, but the first goes first

    assert not UsageRecord.objects.exists()
    assert [f["request_id"] for _, f in get_journal().oldest()] == [first.request_id, second.request_id]

    get_journal().flush()

    assert UsageRecord.objects.count() == 2 and DailyUsage.objects.get().requests == 2
    assert not get_journal().backlogged  # the next record writes itself again
    third = post(valid_key.plaintext, body())
    assert UsageRecord.objects.filter(request_id=third.request_id).exists()


def test_a_flush_stops_while_the_database_is_down_and_keeps_every_record(valid_key, monkeypatch):
    DatabaseDown(monkeypatch)
    journal = get_journal()
    for request_id in ("cmpl-a", "cmpl-b"):
        assert not journal_module.write_durably(fields(request_id, valid_key.api_key))

    assert journal.flush() == 0

    assert journal.records == 2 and journal.backlogged and not database_health.reachable


def test_a_record_already_in_the_database_is_not_counted_again(valid_key):
    """An acknowledgement lost (the process died between the database's commit and the journal's
    delete): the record is delivered again and changes nothing."""
    journal = get_journal()
    record = fields("cmpl-twice", valid_key.api_key)
    journal.append(record)
    journal_module.write_record(record)
    journal.queue()

    journal.flush()

    assert UsageRecord.objects.count() == 1
    assert DailyUsage.objects.get().requests == 1 and DailyUsage.objects.get().prompt_tokens == 5
    assert journal.records == 0


def test_a_record_is_fsynced_once_when_appended_and_its_delete_after_delivery_is_not(valid_key):
    """One fsync per record: the append commits with ``synchronous=FULL``; the delete once the
    database has it with ``NORMAL`` (a power loss that takes it back only delivers the record again,
    as above), and the connection is back to ``FULL`` for the next append."""
    journal = get_journal()
    statements: list[str] = []
    journal._db.set_trace_callback(statements.append)
    try:
        assert journal_module.write_durably(fields("cmpl-once", valid_key.api_key))
    finally:
        journal._db.set_trace_callback(None)

    def synchronous_at(marker: str) -> str:
        index = next(i for i, statement in enumerate(statements) if statement.startswith(marker))
        pragmas = [s for s in statements[:index] if s.startswith("PRAGMA synchronous=")]
        return pragmas[-1].split("=")[1] if pragmas else "FULL"

    assert synchronous_at("INSERT OR IGNORE INTO records") == "FULL"
    assert synchronous_at("DELETE FROM records") == "NORMAL"
    assert statements[-1] == "PRAGMA synchronous=FULL"
    assert journal._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert journal.records == 0 and UsageRecord.objects.filter(request_id="cmpl-once").exists()


def test_a_journal_left_by_a_process_of_the_same_id_is_replayed_at_start_up(valid_key, settings):
    settings.USAGE_JOURNAL_ID = "8001"
    earlier = get_journal()
    earlier.append(fields("cmpl-left", valid_key.api_key))
    journal_module.forget_journal()  # the process ends without writing it

    successor = get_journal()

    assert successor.path == earlier.path and successor.records == 1 and successor.backlogged
    successor.flush()
    assert UsageRecord.objects.get().request_id == "cmpl-left"


def test_a_process_killed_with_sigkill_has_its_records_and_cut_streams_adopted_by_the_next_one(
    valid_key, settings, tmp_path
):
    directory = Path(settings.USAGE_JOURNAL_DIR)
    killed = f"""
import os, signal, django
django.setup()
from pathlib import Path
from keys.journal import Journal
journal = Journal(Path({str(directory)!r}), "killed", {database_digest()!r})
journal.open()
journal.append({{"request_id": "cmpl-killed", "api_key_id": {valid_key.api_key.pk}, "owner_id": {valid_key.api_key.owner_id},
                "model": "tiny", "status_code": 200, "latency_ms": 3.0, "prompt_tokens": 2, "completion_tokens": 7,
                "total_tokens": 9, "created_at": "2026-12-01T10:00:00+00:00"}})
# A stream that had sent 23 tokens, cut by the kill.
journal.update_in_flight({{"request_id": "cmpl-cut", "api_key_id": {valid_key.api_key.pk},
                          "owner_id": {valid_key.api_key.owner_id}, "model": "tiny", "stream": True,
                          "status_code": 200, "finish_reason": "interrupted", "error_type": "interrupted",
                          "latency_ms": 3.0, "prompt_tokens": 2, "completion_tokens": 23, "total_tokens": 25,
                          "created_at": "2026-12-01T10:00:01+00:00"}})
os.kill(os.getpid(), signal.SIGKILL)
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "completions_site.settings", "PYTHONPATH": str(ROOT)}
    finished = subprocess.run([sys.executable, "-c", killed], env=env, cwd=ROOT, capture_output=True, timeout=120)
    assert finished.returncode == -9, finished.stderr.decode()[-2000:]

    journal = get_journal()  # another process of the machine, later

    assert journal.records == 2 and not list(directory.glob("killed-*")) and in_flight(journal) == {}
    journal.flush()
    record = UsageRecord.objects.get(request_id="cmpl-killed")
    assert record.total_tokens == 9 and record.created_at.isoformat() == "2026-12-01T10:00:00+00:00"
    cut = UsageRecord.objects.get(request_id="cmpl-cut")
    assert (cut.status_code, cut.completion_tokens, cut.finish_reason, cut.stream) == (200, 23, "interrupted", True)


def test_a_running_stream_keeps_a_provisional_record_that_covers_what_its_client_was_sent(tiny_api, valid_key):
    async def scenario():
        response = await open_stream(valid_key.plaintext, body(max_tokens=200, logprobs=0))
        content = response.streaming_content
        raw = [await content.__anext__() for _ in range(20)]
        request_id = response["x-request-id"]
        provisional = in_flight(get_journal())[request_id]
        get_journal().queue()
        await db_call(get_journal().flush)  # the flusher leaves a running stream's record alone
        written_meanwhile = await db_call(UsageRecord.objects.exists)
        raw += [chunk async for chunk in content]
        return request_id, provisional, tokens_in(raw[:20]), written_meanwhile

    request_id, provisional, sent, written_meanwhile = async_to_sync(scenario)()

    assert sent >= 19 and not written_meanwhile
    assert (provisional["status_code"], provisional["finish_reason"]) == (200, "interrupted")
    assert sent <= provisional["completion_tokens"] < 200 and provisional["prompt_tokens"] == 5
    final = UsageRecord.objects.get(request_id=request_id)  # the end replaced the provisional record
    assert (final.completion_tokens, final.finish_reason) == (200, "length")
    assert in_flight(get_journal()) == {} and get_journal().records == 0


def test_a_stream_cut_by_the_end_of_its_process_is_recorded_by_the_next_one(valid_key, settings):
    settings.USAGE_JOURNAL_ID = "8002"
    earlier = get_journal()
    earlier.update_in_flight(fields("cmpl-cut", valid_key.api_key, completion_tokens=30, finish_reason="interrupted"))
    journal_module.forget_journal()  # the process ends while the stream runs

    successor = get_journal()

    assert successor.records == 1 and in_flight(successor) == {}
    successor.flush()
    record = UsageRecord.objects.get(request_id="cmpl-cut")
    assert (record.status_code, record.completion_tokens, record.finish_reason) == (200, 30, "interrupted")


def test_the_journal_of_a_live_process_is_not_adopted(valid_key, settings):
    alive = Journal(Path(settings.USAGE_JOURNAL_DIR), "alive", database_digest())
    alive.open()
    alive.append(fields("cmpl-alive", valid_key.api_key))
    try:
        assert get_journal().records == 0 and alive.path.exists()
    finally:
        alive.close()


def test_a_record_the_database_refuses_for_itself_is_set_aside_not_retried_forever(valid_key):
    set_aside = sample("completions_usage_records_set_aside_total")

    written = journal_module.write_durably(fields("cmpl-bad", valid_key.api_key, prompt_tokens=-1))

    assert written and get_journal().records == 0 and not get_journal().backlogged
    assert sample("completions_usage_records_set_aside_total") == set_aside + 1
    with sqlite3.connect(get_journal().path) as kept:
        assert kept.execute("SELECT request_id FROM set_aside").fetchall() == [("cmpl-bad",)]


def test_a_record_no_version_of_the_code_can_build_is_set_aside_and_blocks_nothing(valid_key):
    # A journal left by an older version: a field a later migration dropped, and a row that is not JSON.
    journal = get_journal()
    old = fields("cmpl-old-version", valid_key.api_key)
    old["field_dropped_by_a_migration"] = 1
    journal.append(old)
    with journal._lock:
        journal._db.execute("INSERT INTO records (request_id, fields) VALUES ('cmpl-garbled', 'not json')")
        journal._db.commit()
    journal.queue()
    journal.flush()
    assert journal_module.write_durably(fields("cmpl-new", valid_key.api_key))
    assert UsageRecord.objects.filter(request_id="cmpl-new").exists()
    assert get_journal().records == 0 and not get_journal().backlogged
    with sqlite3.connect(get_journal().path) as kept:
        aside = {row[0] for row in kept.execute("SELECT request_id FROM set_aside")}
    assert aside == {"cmpl-old-version", "cmpl-garbled"}


def test_two_processes_adopting_one_orphan_leave_no_lock_file_behind(valid_key, settings):
    directory = Path(settings.USAGE_JOURNAL_DIR)
    orphan = Journal(directory, "gone", database_digest())
    orphan.open()
    orphan.append(fields("cmpl-orphan", valid_key.api_key))
    orphan.close()
    first = get_journal()  # adopts it as it opens
    assert not orphan.path.exists()
    second = Journal(directory, "other", database_digest())
    second.open()
    try:
        assert second._adopt(orphan.path) == 0  # it listed the orphan before the first adopted it
        assert not [path.name for path in directory.iterdir() if path.name.startswith("gone")]
    finally:
        second.close()
    assert first.records == 1  # the orphan's record, adopted once


def test_a_record_of_a_key_deleted_while_it_waited_is_kept_without_its_key(valid_key, monkeypatch):
    DatabaseDown(monkeypatch, times=1)
    journal_module.write_durably(fields("cmpl-orphan", valid_key.api_key))
    valid_key.api_key.delete()

    get_journal().flush()

    record = UsageRecord.objects.get(request_id="cmpl-orphan")
    assert record.api_key_id is None and record.owner_id == valid_key.api_key.owner_id


def test_an_unwritable_journal_refuses_new_requests_with_a_503_and_loses_nothing(tiny_api, valid_key, monkeypatch):
    journal = get_journal()
    working = journal._db
    monkeypatch.setattr(journal, "_db", FullDisk())

    served = post(valid_key.plaintext, body())  # admitted before the disk filled up
    refused = post(valid_key.plaintext, body())

    assert served.status == 200 and UsageRecord.objects.filter(request_id=served.request_id).exists()
    assert refused.status == 503 and refused.headers["retry-after"] == "5"
    assert refused.error == {
        "message": "The server cannot record usage right now; retry the request shortly.",
        "type": "server_error",
        "param": None,
        "code": "usage_journal_unavailable",
    }
    assert not UsageRecord.objects.filter(request_id=refused.request_id).exists()
    assert sample("completions_usage_journal_unwritable") == 1
    status, state = healthz()
    assert status == 503 and (state["status"], state["usage_journal"]) == ("unavailable", "unwritable")

    monkeypatch.setattr(journal, "_db", working)  # space again
    assert journal.probe()
    assert post(valid_key.plaintext, body()).status == 200
    assert sample("completions_usage_journal_unwritable") == 0
    status, state = healthz()
    assert status == 200 and (state["status"], state["usage_journal"]) == ("ok", "ok")


def test_a_written_record_the_full_journal_could_not_forget_is_forgotten_once_it_has_space(valid_key):
    journal = get_journal()
    seq, _ = journal.append(fields("cmpl-unforgotten", valid_key.api_key))
    journal_module.write_record(fields("cmpl-unforgotten", valid_key.api_key))
    working = journal._db
    journal._db = FullDisk()
    try:
        journal.ack(seq)  # the disk filled up between the append and the database's answer
    finally:
        journal._db = working

    assert journal.records == 1 and journal.backlogged  # the flusher's work now
    assert journal.flush() == 1
    assert (journal.records, journal.backlogged) == (0, False)
    assert UsageRecord.objects.filter(request_id="cmpl-unforgotten").count() == 1


def test_a_record_neither_the_journal_nor_the_database_took_is_counted_and_logged_as_lost(
    valid_key, monkeypatch, caplog
):
    monkeypatch.setattr(get_journal(), "_db", FullDisk())
    DatabaseDown(monkeypatch)
    lost = sample("completions_usage_records_lost_total")

    with pytest.raises(OperationalError):
        journal_module.write_durably(fields("cmpl-lost", valid_key.api_key))

    assert sample("completions_usage_records_lost_total") == lost + 1
    assert "LOST" in caplog.text and "cmpl-lost" in caplog.text


def test_a_database_known_to_be_down_is_not_waited_for_by_each_record(valid_key, monkeypatch):
    down = DatabaseDown(monkeypatch, times=1)
    assert not journal_module.write_durably(fields("cmpl-1", valid_key.api_key))

    assert not journal_module.write_durably(fields("cmpl-2", valid_key.api_key))

    assert down.left == 0 and get_journal().records == 2  # only the first one tried the database


def test_the_usage_record_of_a_request_keeps_the_time_it_was_served(tiny_api, valid_key, monkeypatch):
    DatabaseDown(monkeypatch, times=1)
    served = post(valid_key.plaintext, body())
    journaled = get_journal().oldest()[0][1]["created_at"]

    async_to_sync(journal_module.db_call)(get_journal().flush)

    assert UsageRecord.objects.get(request_id=served.request_id).created_at == journaled


def test_the_flusher_writes_what_waits_as_soon_as_the_database_answers(valid_key, monkeypatch):
    down = DatabaseDown(monkeypatch, times=2)  # the request's write, then the flusher's first try
    assert not journal_module.write_durably(fields("cmpl-later", valid_key.api_key))

    get_journal().start_flusher()
    deadline = time.monotonic() + 10
    while get_journal().backlogged and time.monotonic() < deadline:
        time.sleep(0.05)

    assert down.left == 0 and UsageRecord.objects.filter(request_id="cmpl-later").count() == 1
    assert get_journal().records == 0 and database_health.reachable
