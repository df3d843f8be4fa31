"""A PostgreSQL database of one's own for tests and benchmarks that run several servers on one.

:func:`scratch_database` creates an empty database beside the one ``url`` names (``E2E_POSTGRES_URL``,
default the local ``test`` database), yields its URL, and drops it afterwards, connections and all.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

POSTGRES_URL = os.environ.get("E2E_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")


def postgres_reachable(url: str = POSTGRES_URL) -> bool:
    """Whether a PostgreSQL server answers at ``url``."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


@contextmanager
def scratch_database(prefix: str, url: str = POSTGRES_URL) -> Iterator[str]:
    """A new database named ``prefix`` plus a random suffix, on ``url``'s server; yields its URL."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
