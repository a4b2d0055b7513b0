"""Where the clients get their connections: from a conninfo (one connection, kept and made again
when it breaks) or from a psycopg_pool pool. Every call runs in its own transaction: autocommit
connections run it as it is, others inside `conn.transaction()`."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Optional, TypeVar

import psycopg

T = TypeVar("T")

APPLICATION_NAME = "pg_fence_client"


def connect_kwargs(application_name: str, connect_timeout: float) -> dict:
    return {
        "autocommit": True,
        "application_name": application_name,
        "connect_timeout": max(1, int(round(connect_timeout))),
        # A connection whose peer vanished (a failover, a dead host) is noticed within seconds.
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }


class Connections:
    """`pinned`: keep one connection, also from a pool, as a keeper (and a session-bound lease) needs."""

    def __init__(
        self,
        conninfo: str = "",
        pool: Any = None,
        *,
        pinned: bool = False,
        application_name: str = APPLICATION_NAME,
        connect_timeout: float = 5,
    ):
        self.conninfo = conninfo
        self.pool = pool
        self.pinned = pinned
        self.kwargs = connect_kwargs(application_name, connect_timeout)
        self._conn: Optional[psycopg.Connection] = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def use(self) -> Iterator[psycopg.Connection]:
        if self.pool is not None and not self.pinned:
            with self.pool.connection() as conn:
                yield conn
            return
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._drop()
                self._conn = (
                    self.pool.getconn() if self.pool is not None else psycopg.connect(self.conninfo, **self.kwargs)
                )
            try:
                yield self._conn
            finally:
                if self._conn.broken:
                    self._drop()

    def current(self) -> Optional[psycopg.Connection]:
        return self._conn

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.pool is not None:
            self.pool.putconn(conn)
        else:
            with contextlib.suppress(Exception):
                conn.close()


def in_transaction(conn: psycopg.Connection, call: Callable[[psycopg.Connection], T]) -> T:
    if conn.autocommit:
        return call(conn)
    with conn.transaction():
        return call(conn)
