"""The usage journal: every usage record is on this machine's disk before the database sees it.

A process appends each record to its own journal, then writes it to the database, then deletes it
from the journal (:func:`write_durably`).  A record the database did not take (down, a lock
timeout, an exhausted pool) stays, and the journal's flusher thread writes what waits, oldest
first, as soon as the database answers (:meth:`Journal.flush`).  The database write is idempotent
on ``request_id`` (:func:`keys.usage.write_record`), so a record delivered twice counts once and
the daily rollup stays exact.

The journal is an SQLite file in WAL mode with ``synchronous=FULL``: an append has reached the
disk when it returns (one fsync per record; its cost is in docs/operations.md).  Files, in
``USAGE_JOURNAL_DIR``: ``<id>-<db>.sqlite3`` and ``<id>-<db>.lock``, where ``id`` is ``USAGE_JOURNAL_ID`` or
``<hostname>-<pid>`` and ``db`` a digest of the database's settings (a journal is replayed only
into the database it was written for).  The process holds the lock (``flock``) for its life.  A
journal whose lock is free belongs to a process that is gone (killed, crashed): at start-up and
every :data:`ORPHAN_SCAN_SECONDS` the flusher adopts it (its records move into this process's
journal, then its files are deleted), so the records of a process killed with SIGKILL are written
by its successor or by any process of the machine sharing the folder.

A stream that is still running keeps its provisional record in the ``in_flight`` table
(:meth:`Journal.update_in_flight`): the record it would get if its process died now, rewritten as
it sends tokens.  The flusher never writes that table to the database; the stream's final record
replaces its row (:meth:`Journal.append`, one transaction).  Only rows left by a process that is
gone become records: those of this journal's earlier process when it is opened, those of an
adopted journal when it is adopted.  Updates of that table, and the deletes of delivered records,
commit with ``synchronous=NORMAL``: a process killed with SIGKILL loses none of them (they are in
the operating system's cache); a power loss may take back the latest few, which the next ``FULL``
commit would have made durable (a delivered record brought back is delivered again, idempotently).  The
row of a stream whose final record the journal could not take (a full disk) stays until its
process ends; written then, it changes nothing if the final record reached the database.

A record the database refuses for itself (an ``IntegrityError`` or ``DataError`` other than a
duplicate) is not retried forever: it is moved to the journal's ``set_aside`` table, kept for the
operators and logged.  When the journal cannot be written (a full disk, a read-only folder),
:attr:`Journal.writable` turns false until a probe write succeeds: the API refuses new generation
requests meanwhile (a 503), and the record that failed goes straight to the database (and is
logged with its fields as lost if that fails too).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import DatabaseError, DataError, IntegrityError, close_old_connections, connection
from django.dispatch import receiver

from . import metrics
from .db import DATABASE_DOWN, database_health, db_call
from .errors import JournalUnavailable
from .usage import prepare_fields, write_record

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # the flusher's tick: how soon a waiting record is tried again
PROBE_SECONDS = 5.0  # how often the flusher checks that the database answers, when nothing waits
ORPHAN_SCAN_SECONDS = 30.0
RETRY_AFTER_SECONDS = 5  # a 503 for an unwritable journal: the flusher probes it every tick
_BATCH = 200  # records written per flusher pass before it looks at the rest of its duties

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL UNIQUE,
    fields TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS in_flight (
    request_id TEXT PRIMARY KEY,
    fields TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS set_aside (
    request_id TEXT PRIMARY KEY,
    fields TEXT NOT NULL,
    reason TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, at REAL NOT NULL);
"""


class Journal:
    """One process's journal in ``directory``; see the module docstring.

    Thread-safe: the request threads append and acknowledge, the flusher thread flushes, adopts and
    probes, all through one SQLite connection behind one lock.
    """

    def __init__(self, directory: Path, journal_id: str, database: str) -> None:
        self.directory = Path(directory)
        self.database = database
        self.name = f"{journal_id}-{database}"
        self.path = self.directory / f"{self.name}.sqlite3"
        self.writable = False
        self.backlogged = False  # records wait for the flusher: new ones queue behind them, in order
        self.records = 0  # records in the journal, not yet acknowledged by the database
        self.wake = threading.Event()
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._lock_file: int | None = None
        self._flusher: _Flusher | None = None
        self._reported = False  # the current failure to write is logged

    # --- opening and closing ----------------------------------------------------------------

    def open(self) -> None:
        """Take this journal's lock, open it, and adopt the journals of processes that are gone.

        Raises ``RuntimeError`` if another live process holds the same journal (two processes
        configured with one ``USAGE_JOURNAL_ID``).  A folder that cannot be written leaves the
        journal unwritable (new requests get a 503) until a probe succeeds.
        """
        if not self._open_files():
            return
        if self.records:
            logger.warning("Usage journal %s: %d records left by an earlier process", self.path, self.records)
            self.backlogged = True
        self.adopt_orphans()
        self._update_gauges()

    def _open_files(self) -> bool:
        """Lock and open the journal's file; ``False`` (and the journal unwritable) if it cannot be."""
        with self._lock:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                if self._lock_file is None:
                    self._lock_file = _lock(self.directory / f"{self.name}.lock", wait=10.0)
                    if self._lock_file is None:
                        raise RuntimeError(
                            f"the usage journal {self.path} is held by another process (USAGE_JOURNAL_ID)"
                        )
                if self._db is None:
                    self._db = _connect(self.path)
                    # No stream of this process can have written yet: the rows are an earlier process's.
                    self._end_in_flight()
                self.records = self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
            except (OSError, sqlite3.Error) as error:
                self._journal_failed(error)
                return False
            if self._lock_file is not None and not self._reported:
                self.writable = True
            return True

    def _end_in_flight(self) -> None:
        """Turn the provisional records left by a process that is gone into records to write."""
        assert self._db is not None
        with self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO records (request_id, fields) SELECT request_id, fields FROM in_flight"
            )
            ended = self._db.execute("DELETE FROM in_flight").rowcount
        if ended:
            logger.warning("Usage journal %s: %d streams cut by the end of an earlier process", self.path, ended)

    def close(self) -> None:
        """Stop the flusher, close the journal and release its lock (tests; a process just exits)."""
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.stop()
            flusher.join(timeout=5)
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._lock_file is not None:
                os.close(self._lock_file)
                self._lock_file = None
            self.writable = False

    def start_flusher(self) -> None:
        """Start the flusher thread (a serving process does, at start-up); idempotent."""
        if self._flusher is None:
            self._flusher = _Flusher(self)
            self._flusher.start()

    # --- the request path -------------------------------------------------------------------

    def append(self, fields: dict[str, Any]) -> tuple[int, bool]:
        """Store one record (the fields :func:`keys.usage.prepare_fields` returns) on disk.

        Returns its sequence number and whether it must wait for the flusher (older records wait:
        they go first).  A record whose ``request_id`` is already in the journal replaces it (the
        latest word wins), as it replaces the request's provisional record, if any.  Raises
        :class:`~keys.errors.JournalUnavailable` if it cannot be written.
        """
        text = json.dumps(fields, default=_iso)
        with self._lock:
            if self._db is None:
                raise JournalUnavailable("the usage journal is not open")
            try:
                with self._db:
                    cursor = self._db.execute(
                        "INSERT OR IGNORE INTO records (request_id, fields) VALUES (?, ?)", (fields["request_id"], text)
                    )
                    new = bool(cursor.rowcount)
                    if not new:
                        cursor = self._db.execute(
                            "UPDATE records SET fields = ? WHERE request_id = ? RETURNING seq",
                            (text, fields["request_id"]),
                        )
                    seq = cursor.lastrowid if new else cursor.fetchone()[0]
                    self._db.execute("DELETE FROM in_flight WHERE request_id = ?", (fields["request_id"],))
            except (OSError, sqlite3.Error) as error:
                self._journal_failed(error)
                raise JournalUnavailable(str(error)) from error
            self.records += new
            waiting = self.backlogged
        metrics.journal_records.set(self.records)
        assert seq is not None
        return seq, waiting

    def update_in_flight(self, fields: dict[str, Any]) -> None:
        """Store or replace the provisional record of a stream still running (fields as for
        :meth:`append`): the record written if this process dies before the stream ends.

        Committed with ``synchronous=NORMAL`` (no fsync: it survives the process, not a power
        loss).  Raises :class:`~keys.errors.JournalUnavailable` if it cannot be written.
        """
        text = json.dumps(fields, default=_iso)
        with self._lock:
            if self._db is None:
                raise JournalUnavailable("the usage journal is not open")
            try:
                with _without_fsync(self._db):
                    self._db.execute(
                        "INSERT INTO in_flight (request_id, fields) VALUES (?, ?)"
                        " ON CONFLICT (request_id) DO UPDATE SET fields = excluded.fields",
                        (fields["request_id"], text),
                    )
            except (OSError, sqlite3.Error) as error:
                self._journal_failed(error)
                raise JournalUnavailable(str(error)) from error

    def ack(self, seq: int) -> None:
        """The database has record ``seq``: forget it.  Never raises (a record kept by mistake is
        written again later, which changes nothing).  Committed without fsync, for that reason: a
        power loss may bring back the latest few, which are then delivered again."""
        with self._lock:
            if self._db is None:
                return
            try:
                with _without_fsync(self._db):
                    self.records -= self._db.execute("DELETE FROM records WHERE seq = ?", (seq,)).rowcount
            except (OSError, sqlite3.Error) as error:
                logger.warning("Usage journal %s: could not forget a written record: %s", self.path, error)
                self.backlogged = True  # the flusher forgets it (writing it again) once the journal can be written
        metrics.journal_records.set(self.records)

    def queue(self) -> None:
        """Records now wait for the flusher (the database did not answer): wake it, unless they
        already did (it tries again every :data:`FLUSH_SECONDS`)."""
        if not self.backlogged:
            self.backlogged = True
            self.wake.set()

    # --- the flusher's work -----------------------------------------------------------------

    def oldest(self, after: int = 0, limit: int = _BATCH) -> list[tuple[int, dict[str, Any]]]:
        """Up to ``limit`` waiting records after sequence number ``after``, oldest first, as ``(seq, fields)``."""
        with self._lock:
            if self._db is None:
                return []
            rows = self._db.execute(
                "SELECT seq, request_id, fields FROM records WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            ).fetchall()
        return [(seq, _readable(request_id, text)) for seq, request_id, text in rows]

    def flush(self) -> int:
        """Write the waiting records to the database, oldest first, until none is left or the database
        stops answering; returns how many were written (or set aside).  Runs in the calling thread.

        One pass: a record that could not be forgotten (the journal failing meanwhile) waits for the next.
        """
        done = last = 0
        while batch := self.oldest(after=last):
            for seq, fields in batch:
                if not _deliver(self, seq, fields):
                    return done
                done, last = done + 1, seq
        with self._lock:
            # Under the lock: an append from now on sees backlogged false and writes itself.
            if self._db is not None and self._db.execute("SELECT 1 FROM records LIMIT 1").fetchone() is None:
                self.backlogged = False
                self.records = 0
        metrics.journal_records.set(self.records)
        return done

    def set_aside(self, seq: int, fields: dict[str, Any], reason: str) -> None:
        """Move record ``seq``, which the database refuses for itself, to the ``set_aside`` table."""
        logger.error(
            "Usage record %s set aside in %s: the database refuses it (%s): %s",
            fields.get("request_id"),
            self.path,
            reason,
            json.dumps(fields, default=_iso),
        )
        metrics.usage_records_set_aside.inc()
        with self._lock:
            if self._db is None:
                return
            try:
                with self._db:
                    self._db.execute(
                        "INSERT OR REPLACE INTO set_aside (request_id, fields, reason, at) VALUES (?, ?, ?, ?)",
                        (fields["request_id"], json.dumps(fields, default=_iso), reason, _iso(datetime.now())),
                    )
                    self.records -= self._db.execute("DELETE FROM records WHERE seq = ?", (seq,)).rowcount
            except (OSError, sqlite3.Error) as error:
                logger.warning("Usage journal %s: could not set a record aside: %s", self.path, error)

    def adopt_orphans(self) -> int:
        """Move into this journal the records of journals (of the same database) whose process is
        gone, and delete their files; returns how many records were adopted."""
        adopted = 0
        for path in sorted(self.directory.glob(f"*-{self.database}.sqlite3")):
            if path == self.path:
                continue
            try:
                adopted += self._adopt(path)
            except (OSError, sqlite3.Error) as error:
                logger.warning("Usage journal %s: could not adopt %s: %s", self.path, path, error)
        if adopted:
            logger.warning("Usage journal %s: adopted %d records of processes that are gone", self.path, adopted)
            self.queue()
        return adopted

    def _adopt(self, path: Path) -> int:
        lock = _lock(path.with_suffix(".lock"), wait=0)
        if lock is None:
            return 0  # its process is alive
        try:
            if not path.exists():  # another process adopted it meanwhile; our lock made its file again
                path.with_suffix(".lock").unlink(missing_ok=True)
                return 0
            orphan = _connect(path)
            try:
                rows = orphan.execute("SELECT request_id, fields FROM records ORDER BY seq").fetchall()
                # Its streams were cut when it died: their provisional records are final now.
                rows += orphan.execute("SELECT request_id, fields FROM in_flight").fetchall()
                aside = orphan.execute("SELECT request_id, fields, reason, at FROM set_aside").fetchall()
            finally:
                orphan.close()
            with self._lock:
                if self._db is None:
                    return 0
                with self._db:
                    # An adopted record keeps its fields; one already here (the same request) is newer.
                    self._db.executemany("INSERT OR IGNORE INTO records (request_id, fields) VALUES (?, ?)", rows)
                    self._db.executemany("INSERT OR IGNORE INTO set_aside VALUES (?, ?, ?, ?)", aside)
                    self.records = self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            path.with_suffix(".lock").unlink(missing_ok=True)
        finally:
            os.close(lock)
        return len(rows)

    def probe(self) -> bool:
        """Try a small write (after a failure); the journal is writable again if it succeeds."""
        if not self._open_files():
            return False
        with self._lock:
            try:
                with self._db:  # type: ignore[union-attr]  # opened just above
                    self._db.execute("INSERT OR REPLACE INTO probe (id, at) VALUES (1, ?)", (time.time(),))  # type: ignore[union-attr]
            except (OSError, sqlite3.Error) as error:
                self._journal_failed(error)
                return False
            if not self.writable:
                logger.warning("Usage journal %s is writable again", self.path)
            self.writable = True
            self._reported = False
        metrics.journal_unwritable.set(0)
        return True

    def wait_flushed(self, timeout: float) -> bool:
        """Wake the flusher and wait up to ``timeout`` seconds until nothing waits; returns whether
        nothing does (a process about to exit gives its records a last chance)."""
        deadline = time.monotonic() + timeout
        self.wake.set()
        while self.backlogged and self._flusher is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.backlogged

    def size_bytes(self) -> int:
        """The journal's files' size on disk (the database and its write-ahead log)."""
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.stat(f"{self.path}{suffix}").st_size
            except OSError:
                pass
        return total

    def _journal_failed(self, error: BaseException) -> None:
        if not self._reported:
            logger.error("Usage journal %s cannot be written (%s): new requests get a 503", self.path, error)
            self._reported = True
        self.writable = False
        metrics.journal_unwritable.set(1)
        metrics.journal_errors.inc()

    def _update_gauges(self) -> None:
        metrics.journal_records.set(self.records)
        metrics.journal_bytes.set(self.size_bytes())
        metrics.journal_unwritable.set(int(not self.writable))


def write_durably(fields: dict[str, Any]) -> bool:
    """Journal one record (as :func:`keys.usage.prepare_fields` returns it), then write it to the
    database; ``True`` once the database has it, ``False`` when it waits in the journal.

    It waits when the database did not answer, when the database is known to be down, or when older
    records wait (they go first).  Raises ``DatabaseError`` only when the journal could not take the
    record and the database did not either: the record is lost (logged with its fields, counted).
    Synchronous: call it in a database thread (:func:`record`).
    """
    journal = get_journal()
    try:
        seq, waiting = journal.append(fields)
    except JournalUnavailable:
        try:
            write_record(fields)
        except DatabaseError:
            metrics.usage_records_lost.inc()
            logger.error(
                "Usage record LOST (neither the journal nor the database took it): %s", json.dumps(fields, default=_iso)
            )
            raise
        return True
    if waiting or not database_health.reachable or not _deliver(journal, seq, fields):
        metrics.usage_record_failures.inc()
        journal.queue()
        return False
    return True


async def record(**fields: Any) -> bool:
    """:func:`write_durably` for one request's record, from async code; ``fields`` as
    :func:`keys.usage.record_usage` takes them."""
    return await db_call(write_durably, prepare_fields(fields))


async def record_in_flight(**fields: Any) -> bool:
    """Journal a running stream's provisional record (:meth:`Journal.update_in_flight`; ``fields``
    as :func:`record` takes them); ``False`` when the journal cannot take it (its final record will
    go to the database directly, as any record does then)."""
    return await asyncio.to_thread(_update_in_flight, prepare_fields(fields))


def _update_in_flight(fields: dict[str, Any]) -> bool:
    try:
        get_journal().update_in_flight(fields)
    except JournalUnavailable:
        return False
    return True


def _deliver(journal: Journal, seq: int, fields: dict[str, Any]) -> bool:
    """Write one journaled record to the database and forget it; ``False`` (and the record waits)
    when the database did not answer.  A record the database refuses for itself is set aside."""
    started = time.monotonic()
    try:
        write_record(fields)
    except (IntegrityError, DataError) as error:
        journal.set_aside(seq, fields, f"{type(error).__name__}: {error}")
        return True
    except DatabaseError as error:
        if isinstance(error, DATABASE_DOWN):
            database_health.failed(error)  # logged once per outage
        else:
            logger.warning(
                "Usage record %s waits in the journal: %s: %s", fields.get("request_id"), type(error).__name__, error
            )
        journal.backlogged = True  # not queue(): the flusher must not wake itself up at once
        return False
    except Exception as error:  # noqa: BLE001 - a record this code cannot build (a field an upgrade dropped) must not block the rest
        journal.set_aside(seq, fields, f"{type(error).__name__}: {error}")
        return True
    database_health.answered(started)
    journal.ack(seq)
    return True


class _Flusher(threading.Thread):
    """Writes waiting records, adopts orphaned journals, and probes the journal and the database."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(name="usage-journal", daemon=True)
        self.journal = journal
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True
        self.journal.wake.set()

    def run(self) -> None:
        next_scan = time.monotonic() + ORPHAN_SCAN_SECONDS
        next_probe = 0.0
        while not self._stopped:
            try:
                if not self.journal.writable:
                    self.journal.probe()
                if time.monotonic() >= next_scan:
                    self.journal.adopt_orphans()
                    next_scan = time.monotonic() + ORPHAN_SCAN_SECONDS
                if self.journal.backlogged:
                    self.journal.flush()
                elif time.monotonic() >= next_probe or not database_health.reachable:
                    _probe_database()
                    next_probe = time.monotonic() + PROBE_SECONDS
                self.journal._update_gauges()
            except Exception:
                logger.exception("Usage journal flusher failed; trying again")
            finally:
                close_old_connections()  # a broken or pooled connection goes back before the wait
            self.journal.wake.wait(FLUSH_SECONDS)
            self.journal.wake.clear()  # a wake-up during the tick was served by it or the next


def _probe_database() -> None:
    started = time.monotonic()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DATABASE_DOWN as error:
        database_health.failed(error)
        return
    database_health.answered(started)


# --- the process's journal ----------------------------------------------------------------------

_journal: Journal | None = None
_journal_lock = threading.Lock()


def get_journal() -> Journal:
    """The process's :class:`Journal`, opened on first use from the settings."""
    global _journal
    with _journal_lock:
        if _journal is None:
            journal_id = settings.USAGE_JOURNAL_ID or f"{socket.gethostname()}-{os.getpid()}"
            journal = Journal(Path(settings.USAGE_JOURNAL_DIR), journal_id, database_digest())
            journal.open()
            _journal = journal
        return _journal


def accepting() -> bool:
    """Whether new requests may be served: their usage record can be journaled."""
    return get_journal().writable


def database_digest() -> str:
    """8 hex digits naming the default database (engine, host, port, name): a journal's records go there."""
    db = connection.settings_dict
    identity = "|".join(str(db.get(key, "")) for key in ("ENGINE", "HOST", "PORT", "NAME"))
    return hashlib.sha256(identity.encode()).hexdigest()[:8]


def forget_journal() -> None:
    """Close the process's journal; the next use opens one from the settings (tests)."""
    global _journal
    with _journal_lock:
        journal, _journal = _journal, None
    if journal is not None:
        journal.close()


@receiver(setting_changed)
def _reopen_journal(*, setting: str, **kwargs: Any) -> None:
    if setting in ("USAGE_JOURNAL_DIR", "USAGE_JOURNAL_ID"):
        forget_journal()


# --- helpers ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _without_fsync(db: sqlite3.Connection) -> Iterator[None]:
    """One transaction committed with ``synchronous=NORMAL``: it survives the process, not a power
    loss (the connection's next ``FULL`` commit makes it durable)."""
    db.execute("PRAGMA synchronous=NORMAL")
    try:
        with db:
            yield
    finally:
        db.execute("PRAGMA synchronous=FULL")


def _connect(path: Path) -> sqlite3.Connection:
    """An autocommit connection to the journal at ``path``, created if new: WAL, synchronous=FULL."""
    db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
        db.executescript(_SCHEMA)
        db.isolation_level = "DEFERRED"  # "with db:" makes a transaction from here on
    except BaseException:
        db.close()
        raise
    return db


def _lock(path: Path, wait: float) -> int | None:
    """An open descriptor of ``path`` holding an exclusive ``flock``, or ``None`` if another process
    holds it for longer than ``wait`` seconds.  A lock on a file that was deleted and recreated
    meanwhile is dropped and taken again on the new one."""
    deadline = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)
            continue
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _readable(request_id: str, text: str) -> dict[str, Any]:
    """A journaled record's fields, or ``{"request_id": ..., "unreadable": text}`` (which the database
    write refuses, so that the record is set aside) where the text is not a record's JSON."""
    try:
        fields = _loaded(text)
    except (ValueError, AttributeError):
        return {"request_id": request_id, "unreadable": text}
    return fields


def _loaded(text: str) -> dict[str, Any]:
    fields = json.loads(text)
    if isinstance(fields.get("created_at"), str):
        fields["created_at"] = datetime.fromisoformat(fields["created_at"])
    return fields
