"""A lease kept renewed by a background thread, and declared lost the moment it may be.

Two threads: the renewer renews every `renew_every` on the lease's own connection and retries
failures with jittered pauses; the watchdog declares the lease "unknown" at its local deadline
(see holding.py). They are apart because a renewal can hang (a stopped server answers nothing)
and the deadline must fire all the same."""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from typing import Any, Callable, Optional

from . import calls
from .connections import Connections
from .errors import LeaseLost
from .holding import HELD, LOST, RELEASED, UNKNOWN, Holding
from .lease import Lease
from .retry import Retry

log = logging.getLogger("pg_fence")


class KeptLease:
    def __init__(
        self,
        lease: Lease,
        connections: Connections,
        retry: Retry,
        *,
        ttl: float,
        sent_at: float,
        renew_every: Optional[float],
        margin: float,
        session_bound: bool,
        on_lost: Optional[Callable[["KeptLease"], Any]],
        release_timeout: float,
    ):
        self._holding = Holding(lease, ttl, sent_at, renew_every, margin, session_bound)
        self._connections = connections
        self._retry = retry
        self._on_lost = on_lost
        self._release_timeout = release_timeout
        #: Set when the lease is lost or its state unknown: stop the work done under it.
        self.lost = threading.Event()
        self._stop = _Stop()
        self._holding.renew_at_once_if_slow()
        self._threads = [
            threading.Thread(target=self._renew_loop, name=f"pg_fence renew {lease.key}", daemon=True),
            threading.Thread(target=self._watch, name=f"pg_fence deadline {lease.key}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def lease(self) -> Lease:
        return self._holding.lease

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def fence(self) -> int:
        return self.lease.fence

    @property
    def token(self) -> Any:
        return self.lease.token

    @property
    def state(self) -> str:
        """ "held", "lost" (the server said so), "unknown" (its deadline passed unconfirmed) or "released"."""
        if self._holding.state == HELD and self._holding.remaining() <= 0:
            self._declare(UNKNOWN)
        return self._holding.state

    @property
    def deadline(self) -> float:
        """time.monotonic() until which the lease is known to be held, short of a renewal."""
        return self._holding.deadline

    @property
    def lost_at(self) -> Optional[float]:
        """time.monotonic() when the lease was declared lost or unknown."""
        return self._holding.lost_at

    @property
    def last_error(self) -> Optional[BaseException]:
        """The last failure of a renewal, for logs."""
        return self._holding.last_error

    def held(self) -> bool:
        return self.state == HELD

    def check(self) -> None:
        """Raises LeaseLost unless the lease is still held by its local deadline."""
        state = self.state
        if state != HELD:
            raise LeaseLost(self.key, f"lease on {self.key!r} is {state}", state=state)

    def guard(self, conn: Any) -> None:
        """fence_guard in your transaction on `conn`, after a local check."""
        self.check()
        calls.fence_guard(conn, self.key, self.fence)

    def fenced_update(self, conn: Any, table: str, changes: dict, filter: dict) -> int:
        """fenced_update in your transaction on `conn`, after a local check."""
        self.check()
        return calls.fenced_update(conn, self.key, self.fence, table, changes, filter)

    def release(self) -> bool:
        """Stops renewing and releases; bounded by release_timeout (the TTL ends it anyway)."""
        was_held = self._holding.declare(RELEASED)
        self._stop.set()
        if not was_held:
            self._finish()
            return False
        result: list = []
        releaser = threading.Thread(target=lambda: result.append(self._release_once()), daemon=True)
        releaser.start()
        releaser.join(self._release_timeout)
        self._finish()
        return bool(result and result[0])

    def __enter__(self) -> "KeptLease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _release_once(self) -> bool:
        for thread in self._threads:
            thread.join(self._release_timeout)
        with contextlib.suppress(Exception):
            with self._connections.use() as conn:
                return calls.release(conn, self.lease)
        return False

    def _finish(self) -> None:
        if not any(thread.is_alive() for thread in self._threads):
            self._connections.close()

    def _declare(self, state: str) -> None:
        if not self._holding.declare(state):
            return
        self.lost.set()
        self._stop.set()
        log.warning("pg_fence: lease on %r %s", self.key, "lost" if state == LOST else "state unknown")
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("pg_fence: on_lost callback failed")

    def _watch(self) -> None:
        while not self._stop.wait(max(0.0, self._holding.remaining())):
            if self._holding.remaining() <= 0:
                self._declare(UNKNOWN)
                return

    def _renew_loop(self) -> None:
        try:
            self._renew_until_stopped()
        finally:
            if self._holding.state in (LOST, UNKNOWN):
                self._connections.close()
            self._stop.close()

    def _renew_until_stopped(self) -> None:
        holding = self._holding
        while not self._pause(holding):
            sent = time.monotonic()
            try:
                with self._connections.use() as conn:
                    conn.execute(*holding.statement_timeout())
                    renewed = calls.renew(conn, holding.lease, holding.ttl)
            except Exception as err:
                if holding.renewal_failed(err, self._retry.pause):
                    self._declare(LOST)
                    return
                continue
            if not holding.renewed(sent, renewed) and holding.state != RELEASED:
                # Renewed after it was declared lost: nobody works under it now, so free the key.
                with contextlib.suppress(Exception), self._connections.use() as conn:
                    calls.release(conn, renewed)
                return

    def _pause(self, holding: Holding) -> bool:
        """Waits until the next renewal is due; True when stopped. A session-bound lease's
        connection is watched meanwhile: the server writes to an idle session only when it ends
        it (pg_terminate_backend, a shutdown), and then the lease is gone, so renew at once to
        find out, instead of at the next renewal."""
        timeout = max(0.0, holding.next_renewal - time.monotonic())
        conn = self._connections.current() if holding.session_bound else None
        if conn is None or conn.closed:
            return self._stop.wait(timeout)
        if self._stop.wait(timeout, conn.fileno()):
            return True
        holding.next_renewal = min(holding.next_renewal, time.monotonic())
        return False


class _Stop:
    """A threading.Event whose wait can also end when a socket becomes readable."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._wake, self._waker = socket.socketpair()

    def set(self) -> None:
        self._event.set()
        with contextlib.suppress(OSError):
            self._waker.send(b"x")

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float, fd: Optional[int] = None) -> bool:
        if fd is None:
            return self._event.wait(timeout)
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake, selectors.EVENT_READ)
            selector.register(fd, selectors.EVENT_READ)
            selector.select(timeout)
        return self._event.is_set()

    def close(self) -> None:
        self._wake.close()
        self._waker.close()
