"""Database calls from async code, and whether the database answers.

Django's async ORM runs each query in the request's own thread, whose connection stays open until
the response is closed.  A streamed completion keeps its response open for as long as it
generates, so with a connection pool (``DATABASE_POOL_MAX_SIZE``, PostgreSQL) a few hundred
concurrent streams would hold every pooled connection while doing nothing with it.  :func:`db_call`
runs a function in that same thread and then returns the connection to the pool.  Without a pool
it changes nothing (SQLite keeps its connection).

:data:`database_health` remembers whether the database answered this process's last query:
``/healthz`` reports it, and usage records wait in the journal instead of each waiting for a
database known to be down (:mod:`keys.journal`, whose flusher also probes the database).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection

T = TypeVar("T")
logger = logging.getLogger(__name__)

# The errors of a database that does not answer (down, restarting, unreachable, a pool with no
# connection to give): worth a 503 and a retry, unlike a query the database refuses.
DATABASE_DOWN = (OperationalError, InterfaceError)


class DatabaseHealth:
    """Whether the database answered: ``reachable`` until a query fails with :data:`DATABASE_DOWN`,
    again once a query that began after that failure succeeds.  Plain attributes: any thread."""

    def __init__(self) -> None:
        self.reachable = True
        self.last_failure = 0.0  # time.monotonic() of the last failure
        self.error = ""

    def failed(self, error: BaseException) -> None:
        """A query failed because the database did not answer."""
        self.last_failure = time.monotonic()
        self.error = f"{type(error).__name__}: {error}".strip()
        if self.reachable:
            logger.error("The database does not answer (%s)", self.error)
        self.reachable = False

    def answered(self, started: float) -> None:
        """A query begun at ``started`` (``time.monotonic()``) succeeded."""
        if not self.reachable and started > self.last_failure:
            logger.warning("The database answers again")
            self.reachable = True


database_health = DatabaseHealth()


async def db_call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)`` in the request's database thread, then release a pooled connection.

    Exceptions pass through; one of :data:`DATABASE_DOWN` marks the database unreachable.
    """
    return await sync_to_async(_call_and_release)(function, args, kwargs)


def _call_and_release(function: Callable[..., T], args: tuple, kwargs: dict) -> T:
    started = time.monotonic()
    try:
        result = function(*args, **kwargs)
    except DATABASE_DOWN as error:
        database_health.failed(error)
        raise
    finally:
        release_pooled_connection()
    database_health.answered(started)
    return result


def release_pooled_connection() -> None:
    """Give this thread's pooled connection back to the pool; never inside a transaction."""
    if connection.settings_dict.get("OPTIONS", {}).get("pool") and not connection.in_atomic_block:
        connection.close()
