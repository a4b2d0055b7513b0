"""The sync client: calls that retry a broken connection, and kept leases."""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from typing import Any, Callable, Optional, Tuple

from . import calls
from .connections import APPLICATION_NAME, Connections, bounded, retrying
from .errors import OutcomeUnknown, WaitTimedOut, outcome_unknown
from .holding import Holding, check_timing, clock
from .keeper import KeptLease
from .lease import Acquire, Lease, Seconds, interval, new_token
from .retry import Retry, Tries


class Client:
    """pg_fence through a conninfo (`Client("host=... dbname=...")`) or a psycopg_pool pool
    (`Client(pool=pool)`). Thread-safe. Acquires carry a client-drawn token, so a retry after a
    lost reply gets the lease that reply granted. Each try of a call waits `call_timeout` seconds
    at most (beyond an acquire's `wait`): a stopped server answers nothing."""

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: Any = None,
        retry: Retry = Retry(),
        application_name: str = APPLICATION_NAME,
        connect_timeout: float = 5,
        call_timeout: Optional[float] = 30,
    ):
        self.conninfo = conninfo
        self.pool = pool
        self.retry = retry
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._connections = self.connections()

    def connections(self, pinned: bool = False) -> Connections:
        return Connections(
            self.conninfo,
            self.pool,
            pinned=pinned,
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
        )

    def _limit(self, wait: Seconds = 0) -> Optional[float]:
        return None if self.call_timeout is None else self.call_timeout + interval(wait).total_seconds()

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
        """The lease on `key`, or None when it is held (and `wait` ran out). A session-bound lease
        is bound to the session of the try that got it, which may not be this client's connection
        after a retry: keep session-bound leases with lease()."""
        request, token = Acquire(key, ttl, owner, wait, session_bound, durable), token or new_token()
        return retrying(
            self._connections, self.retry, lambda conn: calls.acquire_with(conn, request, token), self._limit(wait)
        )

    def renew(self, lease: Lease, ttl: Seconds) -> Lease:
        return retrying(self._connections, self.retry, lambda conn: calls.renew(conn, lease, ttl), self._limit())

    def release(self, lease: Lease) -> bool:
        return retrying(self._connections, self.retry, lambda conn: calls.release(conn, lease), self._limit())

    def current_fence(self, key: str) -> Optional[int]:
        return retrying(self._connections, self.retry, lambda conn: calls.current_fence(conn, key), self._limit())

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
        request = Acquire(key, ttl, owner, wait, session_bound, durable)
        ttl_s = request.seconds()[0]
        every = None if renew_every is None else interval(renew_every).total_seconds()
        check_timing(ttl_s, every, interval(margin).total_seconds())
        connections = self.connections(pinned=True)
        try:
            lease, anchor = self._acquire_to_keep(connections, request)
            if lease is None:
                raise WaitTimedOut(f"lease on {key!r} not granted within {interval(wait)}")
            holding = Holding(lease, ttl_s, anchor, every, interval(margin).total_seconds(), session_bound)
            if holding.anchored_long_ago():
                self._renew_now(connections, holding)
        except BaseException:
            connections.close()
            raise
        return KeptLease(holding, connections, self.retry, on_lost, interval(release_timeout).total_seconds())

    def _acquire_to_keep(self, connections: Connections, request: Acquire) -> Tuple[Optional[Lease], float]:
        """The lease and the instant its deadline counts from: before the first try that carried
        its token, since any of those tries may be the one that granted it."""
        tries, token, anchor = Tries(self.retry), new_token(), clock()
        while True:
            try:
                call = functools.partial(calls.acquire_with, request=request, token=token)
                return bounded(connections, call, self._limit(request.wait)), anchor
            except Exception as err:
                try:
                    pause = tries.pause_or_raise(err)
                except OutcomeUnknown as unknown:
                    self._give_up(connections, request.key, token)
                    unknown.token = token
                    raise
                if request.session_bound and outcome_unknown(err):
                    # A grant of that try is bound to its session, which may live on without us
                    # (a partition): give it up, and try again with a new token on a new session.
                    self._give_up(connections, request.key, token)
                    token, anchor = new_token(), None
                time.sleep(pause)
                anchor = clock() if anchor is None else anchor

    def _renew_now(self, connections: Connections, holding: Holding) -> None:
        """A renewal at once, to count the deadline from now; gives the lease up if it fails."""
        sent = clock()
        try:
            renewed = bounded(connections, lambda conn: calls.renew(conn, holding.lease, holding.ttl), self._limit())
        except BaseException:
            self._give_up(connections, holding.lease.key, holding.lease.token)
            raise
        holding.renewed(sent, renewed)

    def _give_up(self, connections: Connections, key: str, token: uuid.UUID) -> None:
        """Releases, best effort, whatever lease `token` may hold on `key`."""
        with contextlib.suppress(Exception):
            bounded(connections, lambda conn: calls.release_token(conn, key, token), self._limit())

    def close(self) -> None:
        self._connections.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
