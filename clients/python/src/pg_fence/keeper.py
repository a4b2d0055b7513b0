"""A lease kept renewed by a background thread, and declared lost the moment it may be.

Two threads: the renewer renews every `renew_every` on the lease's own connection and retries
failures with jittered pauses; the watchdog declares the lease "unknown" at its local deadline
(see holding.py). Each renewal is bounded (connections.bounded): one that hangs on a stopped
server is abandoned with its connection, and the next try makes a new one, which a multi-host
conninfo may send to a new primary. The watchdog does not wait for any of it."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from typing import Any, Callable, List, Optional, TypeVar

from . import calls
from .connections import Connections, bounded, retrying
from .errors import LeaseLost, StaleFence
from .holding import HELD, LOST, UNKNOWN, Holding, clock
from .kept import Kept, SetView
from .lease import Held
from .reasons import SESSION_ENDED, ended_reason
from .reasons import UNKNOWN as NO_REASON
from .retry import Retry

T = TypeVar("T")


class KeptLease(Kept):
    def __init__(
        self,
        holding: Holding,
        connections: Connections,
        retry: Retry,
        on_lost: Optional[Callable[["KeptLease"], Any]],
        release_timeout: float,
    ):
        self._holding = holding
        self._connections = connections
        self._retry = retry
        self._on_lost = on_lost
        self._release_timeout = release_timeout
        #: Set when the lease is lost or its state unknown: stop the work done under it.
        self.lost = threading.Event()
        self._stop = _Stop()
        self._release_wanted = False
        self._released: Optional[bool] = None
        self._release_lock = threading.Lock()
        # Held around each renewal, and by a hand-off or a proclaim (Leadership), which must not
        # meet a renewal in flight.
        self._renewing = threading.RLock()
        label = holding.lease.label
        self._threads = [
            threading.Thread(target=self._renew_loop, name=f"pg_fence renew {label}", daemon=True),
            threading.Thread(target=self._watch, name=f"pg_fence deadline {label}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def guard(self, conn: Any) -> None:
        """fence_guard in your transaction on `conn`, after a local check."""
        self._fenced(lambda: calls.fence_guard(conn, self.key, self.fence))

    def fenced_update(self, conn: Any, table: str, changes: dict, filter: dict) -> int:
        """fenced_update in your transaction on `conn`, after a local check."""
        return self._fenced(lambda: calls.fenced_update(conn, self.key, self.fence, table, changes, filter))

    def _fenced(self, call: Callable[[], T]) -> T:
        """A fenced call under this lease: a local check first; the server's StaleFence means the
        lease is lost, whatever the keeper has heard yet, and lease_status says why (asked on a
        connection of its own: the keeper's may be renewing)."""
        self.check()
        try:
            return call()
        except StaleFence:
            asking = self._connections.sibling()
            try:
                self._declare(LOST, self._reason_of(self._status(asking, self._release_timeout)))
            finally:
                asking.close()
            raise

    def _status(self, connections: Connections, limit: float) -> Optional[List[tuple]]:
        """lease_status's (state, reason) rows of the lease; None when no answer came within `limit`."""
        with contextlib.suppress(Exception):
            return bounded(connections, lambda conn: calls.rows(conn, self._status_query(), ""), limit)
        return None

    def release(self) -> bool:
        """Stops renewing and releases (also a lease whose state is unknown: it may be live),
        trying again on a new connection while the connection breaks; True when the server said
        this release ended the lease. Waits release_timeout at most: a release still waiting for
        a renewal in flight goes on in the background, and the TTL ends the lease anyway."""
        end = time.monotonic() + self._release_timeout
        self._release_wanted = self._holding.release_wanted() or self._release_wanted
        self._stop.set()
        renewer = self._threads[0]
        renewer.join(self._release_timeout)
        if not renewer.is_alive():
            # The renewer had stopped already (the lease was declared lost), or has just
            # released; the connections are no one else's now.
            self._release_if_wanted(end)
        elif self._release_wanted:
            self._released_as(None)
        return bool(self._released)

    def __enter__(self) -> "KeptLease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _release(self, conn: Any) -> bool:
        return calls.ended(conn, self._holding.lease)

    def _release_if_wanted(self, end: Optional[float] = None) -> None:
        """The holder's release, by `end` (time.monotonic(); release_timeout from now by default)."""
        with self._release_lock:
            if self._release_wanted and self._released is None:
                self._released = False
                end = time.monotonic() + self._release_timeout if end is None else end
                answer = None
                with contextlib.suppress(Exception):
                    answer = retrying(self._connections, self._retry, self._release, None, end)
                status = self._status(self._connections, self._release_timeout) if answer is False else None
                self._released = bool(answer)
                self._released_as(answer, ended_reason(status or (), self.lease.durable))
            self._connections.close()

    def _stop_renewing(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(max(0.0, self._holding.remaining())):
            if self._holding.remaining() <= 0:
                self._declare(UNKNOWN)
                return

    def _renew_loop(self) -> None:
        # The only thread that uses the lease's connections while it runs.
        try:
            self._renew_until_stopped()
        finally:
            self._release_if_wanted()
            self._stop.close()

    def _renew_until_stopped(self) -> None:
        holding = self._holding
        while not self._pause(holding):
            sent = clock()
            try:
                with self._renewing:
                    if holding.state != HELD:
                        return  # handed off meanwhile
                    renewed = bounded(self._connections, self._renew, holding.attempt_limit())
            except Exception as err:
                if holding.renewal_failed(err, self._retry.pause):
                    # PF001, or a session-bound lease whose session we lost (it may live on in it,
                    # out of our reach: session_ended all the same, unless the server says more).
                    otherwise = NO_REASON if isinstance(err, LeaseLost) else SESSION_ENDED
                    rows = self._status(self._connections, min(self._release_timeout, holding.renew_every))
                    self._declare(LOST, self._reason_of(rows, otherwise))
                    if holding.give_up_after(err):
                        # A session-bound lease whose session may live on, or the rest of a lost
                        # set (Holding.give_up_after): give it up by its token.
                        with contextlib.suppress(Exception):
                            bounded(self._connections, self._release, self._release_timeout)
                    return
                continue
            if not holding.renewed(sent, renewed) and holding.state in (LOST, UNKNOWN):
                # Renewed after it was declared lost: nobody works under it now, so free the key.
                with contextlib.suppress(Exception):
                    bounded(self._connections, self._release, self._release_timeout)
                return

    def _renew(self, conn: Any) -> Held:
        # Scoped to the renewal's transaction, so a pool's connection goes back unchanged.
        with conn.transaction():
            conn.execute(*self._holding.statement_timeout())
            return calls.renew(conn, self._holding.lease, self._holding.ttl)

    def _pause(self, holding: Holding) -> bool:
        """Waits until the next renewal is due; True when stopped. A session-bound lease's
        connection is watched meanwhile: the server writes to an idle session only when it ends
        it (pg_terminate_backend, a shutdown), and then the lease is gone, so renew at once to
        find out, instead of at the next renewal."""
        timeout = max(0.0, holding.next_renewal - clock())
        conn = self._connections.current() if holding.session_bound else None
        if conn is None or conn.closed:
            return self._stop.wait(timeout)
        if self._stop.wait(timeout, conn.fileno()):
            return True
        holding.next_renewal = min(holding.next_renewal, clock())
        return False


class KeptLeaseSet(SetView, KeptLease):
    """A lease set (Client.lease_set) kept as KeptLease keeps a lease: renewed in one call for the
    whole set (lease_renew_all), lost as a whole when any of its leases is, released as a whole."""

    def guard(self, conn: Any, key: str) -> None:  # type: ignore[override]
        """fence_guard of the set's lease on `key` in your transaction on `conn`, after a local check."""
        fence = self.fence_of(key)
        self._fenced(lambda: calls.fence_guard(conn, key, fence))

    def fenced_update(self, conn: Any, key: str, table: str, changes: dict, filter: dict) -> int:  # type: ignore[override]
        """fenced_update under the set's lease on `key`, in your transaction on `conn`."""
        fence = self.fence_of(key)
        return self._fenced(lambda: calls.fenced_update(conn, key, fence, table, changes, filter))


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
