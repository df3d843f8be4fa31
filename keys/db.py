"""Database calls from async code that hand a pooled connection back as soon as they are done.

Django's async ORM runs each query in the request's own thread, whose connection stays open until
the response is closed.  A streamed completion keeps its response open for as long as it
generates, so with a connection pool (``DATABASE_POOL_MAX_SIZE``, PostgreSQL) a few hundred
concurrent streams would hold every pooled connection while doing nothing with it.  :func:`db_call`
runs a function in that same thread and then returns the connection to the pool.  Without a pool
it changes nothing (SQLite keeps its connection).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection

T = TypeVar("T")


async def db_call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)`` in the request's database thread, then release a pooled connection."""
    return await sync_to_async(_call_and_release)(function, args, kwargs)


def _call_and_release(function: Callable[..., T], args: tuple, kwargs: dict) -> T:
    try:
        return function(*args, **kwargs)
    finally:
        release_pooled_connection()


def release_pooled_connection() -> None:
    """Give this thread's pooled connection back to the pool; never inside a transaction."""
    if connection.settings_dict.get("OPTIONS", {}).get("pool") and not connection.in_atomic_block:
        connection.close()
