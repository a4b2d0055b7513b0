"""The sync client: calls that retry a broken connection, and kept leases."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Optional, TypeVar

import psycopg

from . import calls
from .connections import APPLICATION_NAME, Connections, in_transaction
from .errors import WaitTimedOut
from .keeper import KeptLease
from .lease import Lease, Seconds, interval, new_token
from .retry import Retry, pause_or_raise

T = TypeVar("T")


def retrying(connections: Connections, retry: Retry, call: Callable[[psycopg.Connection], T]) -> T:
    """`call` in its own transaction, tried again on a new connection while the failure is a broken
    connection or a standby (25006); OutcomeUnknown when the tries run out on a broken one."""
    pauses = retry.pauses()
    while True:
        try:
            with connections.use() as conn:
                return in_transaction(conn, call)
        except Exception as err:
            time.sleep(pause_or_raise(err, pauses))


class Client:
    """pg_fence through a conninfo (`Client("host=... dbname=...")`) or a psycopg_pool pool
    (`Client(pool=pool)`). Thread-safe. Acquires carry a client-drawn token, so a retry after a
    lost reply gets the lease that reply granted."""

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: Any = None,
        retry: Retry = Retry(),
        application_name: str = APPLICATION_NAME,
        connect_timeout: float = 5,
    ):
        self.conninfo = conninfo
        self.pool = pool
        self.retry = retry
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self._connections = self.connections()

    def connections(self, pinned: bool = False) -> Connections:
        return Connections(
            self.conninfo,
            self.pool,
            pinned=pinned,
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
        )

    def acquire(
        self,
        key: str,
        ttl: Seconds,
        *,
        owner: Optional[str] = None,
        wait: Seconds = 0,
        session_bound: bool = False,
        durable: bool = True,
        token: Optional[uuid.UUID] = None,
    ) -> Optional[Lease]:
        """The lease on `key`, or None when it is held (and `wait` ran out)."""
        token = token or new_token()
        return retrying(
            self._connections,
            self.retry,
            lambda conn: calls.acquire(
                conn, key, ttl, owner=owner, wait=wait, session_bound=session_bound, durable=durable, token=token
            ),
        )

    def renew(self, lease: Lease, ttl: Seconds) -> Lease:
        return retrying(self._connections, self.retry, lambda conn: calls.renew(conn, lease, ttl))

    def release(self, lease: Lease) -> bool:
        return retrying(self._connections, self.retry, lambda conn: calls.release(conn, lease))

    def current_fence(self, key: str) -> Optional[int]:
        return retrying(self._connections, self.retry, lambda conn: calls.current_fence(conn, key))

    def lease(
        self,
        key: str,
        ttl: Seconds,
        *,
        wait: Seconds = 0,
        owner: Optional[str] = None,
        session_bound: bool = False,
        durable: bool = True,
        renew_every: Optional[Seconds] = None,
        margin: Seconds = 0,
        on_lost: Optional[Callable[[KeptLease], None]] = None,
        release_timeout: Seconds = 5,
    ) -> KeptLease:
        """Acquires `key` and keeps it renewed in the background on a connection of its own;
        WaitTimedOut when it is not granted within `wait`. Use it as a context manager, which
        releases on exit; watch `lease.lost` (or pass `on_lost`) to learn that it was lost."""
        connections = self.connections(pinned=True)
        token = new_token()
        sent = time.monotonic()
        try:
            lease = retrying(
                connections,
                self.retry,
                lambda conn: calls.acquire(
                    conn, key, ttl, owner=owner, wait=wait, session_bound=session_bound, durable=durable, token=token
                ),
            )
        except BaseException:
            connections.close()
            raise
        if lease is None:
            connections.close()
            raise WaitTimedOut(f"lease on {key!r} not granted within {interval(wait)}")
        return KeptLease(
            lease,
            connections,
            self.retry,
            ttl=interval(ttl).total_seconds(),
            sent_at=sent,
            renew_every=None if renew_every is None else interval(renew_every).total_seconds(),
            margin=interval(margin).total_seconds(),
            session_bound=session_bound,
            on_lost=on_lost,
            release_timeout=interval(release_timeout).total_seconds(),
        )

    def close(self) -> None:
        self._connections.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
