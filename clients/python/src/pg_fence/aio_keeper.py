"""A lease kept renewed in the background, and declared lost the moment it may be.

Two threads (tasks, in pg_fence.aio): the renewer renews every `renew_every`, through the client's
keeper (aio_keeping.py: with the other leases due, on the keeper's connections; a session-bound
lease on its own session), and retries failures with jittered pauses; the watchdog declares the lease "unknown" at
its local deadline (see holding.py). Each renewal is bounded (connections.bounded): one that hangs
on a stopped server is abandoned with its connection, and the next try makes a new one, which a
multi-host conninfo may send to a new primary. The watchdog does not wait for any of it.

A task is cancelled where a thread is told to stop: a task's renewal in flight ends at once, a
thread's within its bound, so a thread's release may be left to the renewer (see release)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any, Awaitable, Callable, List, Optional, TypeVar

import psycopg

from . import aio_calls
from .aio_caller import retrying
from .aio_connections import AsyncConnections, bounded
from .aio_keeping import AsyncKeeper
from .concurrency import AEvent, ALock, AStop, aspawn
from .errors import LeaseLost, StaleFence
from .holding import HELD, LOST, UNKNOWN, Holding, clock
from .kept import Kept, SetView
from .lease import Held, Lease
from .observer import RENEW_LOST, RENEW_OK, Timed
from .reasons import SESSION_ENDED, ended_reason
from .reasons import UNKNOWN as NO_REASON
from .retry import Retry

T = TypeVar("T")


class AsyncKeptLease(Kept):
    """A lease kept renewed, as Client.lease returns it (see README, A lease that keeps itself)."""

    def __init__(
        self,
        holding: Holding,
        connections: AsyncConnections,
        retry: Retry,
        on_lost: Optional[Callable[["AsyncKeptLease"], Any]],
        release_timeout: float,
        keeper: Optional[AsyncKeeper] = None,
    ):
        self._holding = holding
        # The keeper's connections (AsyncLanes), or a session-bound lease's own.
        self._connections = connections
        # Whose lease_renew_many calls renew this lease with others; None: renewed on its own
        # (a session-bound lease, renewed on its session; a set, by lease_renew_all).
        self._keeper = keeper if isinstance(holding.lease, Lease) and not holding.session_bound else None
        self._retry = retry
        self._on_lost = on_lost
        self._release_timeout = release_timeout
        #: Set when the lease is lost or its state unknown: stop the work done under it.
        self.lost = AEvent()
        self._stop = AStop()
        if False:  # SYNC
            # A thread is not cancelled: a release that finds a renewal in flight is left to the
            # renewer, which makes it when the renewal returns (release, _release_if_wanted).
            self._release_wanted = False
            self._released: Optional[bool] = None
            self._release_lock = threading.Lock()
        # Held around each renewal, and by a hand-off or a proclaim (Leadership), which must not
        # meet a renewal in flight.
        self._renewing = ALock()
        label = holding.lease.label
        self._renewer = aspawn(self._renew_loop, f"pg_fence renew {label}")
        self._watchdog = aspawn(self._watch, f"pg_fence deadline {label}")

    async def guard(self, conn: psycopg.AsyncConnection) -> None:
        """fence_guard in your transaction on `conn`, after a local check."""
        await self._fenced(lambda: aio_calls.fence_guard(conn, self.key, self.fence))

    async def fenced_update(self, conn: psycopg.AsyncConnection, table: str, changes: dict, filter: dict) -> int:
        """fenced_update in your transaction on `conn`, after a local check."""
        return await self._fenced(lambda: aio_calls.fenced_update(conn, self.key, self.fence, table, changes, filter))

    async def _fenced(self, call: Callable[[], Awaitable[T]]) -> T:
        """A fenced call under this lease: a local check first; the server's StaleFence means the
        lease is lost, whatever the keeper has heard yet, and lease_status says why (asked on a
        connection of its own: the keeper's may be renewing)."""
        self.check()
        try:
            return await call()
        except StaleFence:
            asking = self._connections.sibling()
            try:
                self._declare(LOST, self._reason_of(await self._status(asking, self._release_timeout)))
            finally:
                await asking.close()
            raise

    async def _status(self, connections: AsyncConnections, limit: float) -> Optional[List[tuple]]:
        """lease_status's (state, reason) rows of the lease; None when no answer came within `limit`."""
        with contextlib.suppress(Exception):
            return await bounded(connections, lambda conn: aio_calls.rows(conn, self._status_query(), ""), limit)
        return None

    async def release(self) -> bool:
        """Stops renewing and releases (also a lease whose state is unknown: it may be live),
        trying again on a new connection while the connection breaks; True when the server said
        this release ended the lease. Waits release_timeout at most: a release still waiting for
        a renewal in flight goes on in the background, and the TTL ends the lease anyway."""
        end = time.monotonic() + self._release_timeout
        if self._holding.expired():
            # Found expired by a renewal, it may have been taken over since: the release says so.
            status = await self._status(self._connections, self._release_timeout)
            self._holding.refine(ended_reason(status or (), self.lease.durable))
        if True:  # ASYNC
            wanted = self._holding.release_wanted()
            for task in (self._watchdog, self._renewer):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            answer = await self._release_by(end) if wanted else None
            await self._connections.close()
            return bool(answer)
        else:
            self._release_wanted = self._holding.release_wanted() or self._release_wanted
            self._stop.set()
            self._renewer.join(self._release_timeout)
            if not self._renewer.is_alive():
                # The renewer had stopped already (the lease was declared lost), or has just
                # released; the connections are no one else's now.
                self._release_if_wanted(end)
            elif self._release_wanted:
                self._released_as(None)
            return bool(self._released)

    async def __aenter__(self) -> "AsyncKeptLease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def _release(self, conn: psycopg.AsyncConnection) -> bool:
        return await aio_calls.ended(conn, self._holding.lease)

    async def _release_by(self, end: float) -> Optional[bool]:
        """The holder's release, tried until `end` (time.monotonic()): the server's answer (None
        when none came), taken as the lease's outcome."""
        answer = None
        with contextlib.suppress(Exception):
            answer = await retrying(self._connections, self._retry, self._release, None, end)
        status = await self._status(self._connections, self._release_timeout) if answer is False else None
        self._released_as(answer, ended_reason(status or (), self.lease.durable))
        return answer

    if False:  # SYNC

        def _release_if_wanted(self, end: Optional[float] = None) -> None:
            """The holder's release, if it asked for one, by `end` (release_timeout from now by
            default), once; from release(), or from the renewer when it stops after it."""
            with self._release_lock:
                if self._release_wanted and self._released is None:
                    self._released = False
                    answer = self._release_by(time.monotonic() + self._release_timeout if end is None else end)
                    self._released = bool(answer)
                self._connections.close()

    def _stop_renewing(self) -> None:
        self._stop.set()
        if True:  # ASYNC
            # A task is: its renewal in flight ends too.
            if asyncio.current_task() is not self._renewer:
                self._renewer.cancel()

    async def _let_expire(self) -> None:
        """Stops renewing without a release: the lease ends at its TTL."""
        self._holding.ended()
        if True:  # ASYNC
            for task in (self._watchdog, self._renewer):
                task.cancel()
            await self._connections.close()
        else:
            self._release_wanted = False
            self._stop.set()

    async def _watch(self) -> None:
        while not await self._stop.wait(max(0.0, self._holding.remaining())):
            if self._holding.remaining() <= 0:
                self._declare(UNKNOWN)
                return

    async def _renew_loop(self) -> None:
        if True:  # ASYNC
            await self._renew_until_stopped()
        else:
            # The only thread that uses the lease's connections while it runs.
            try:
                self._renew_until_stopped()
            finally:
                self._release_if_wanted()
                self._stop.close()

    async def _renew_until_stopped(self) -> None:
        holding = self._holding
        while not await self._pause(holding):
            sent = clock()
            try:
                async with self._renewing:
                    if holding.state != HELD:
                        return  # handed off meanwhile
                    if self._keeper is not None:
                        renewed = await self._keeper.renew(holding, holding.attempt_limit())
                    else:
                        # The keeper times its own calls; this one is timed here.
                        with Timed(holding.observer, "renew_finished", 1) as timed:
                            try:
                                renewed = await bounded(self._connections, self._renew, holding.attempt_limit())
                                timed.outcome = RENEW_OK
                            except LeaseLost:
                                timed.outcome = RENEW_LOST
                                raise
            except Exception as err:
                if holding.renewal_failed(err, self._retry.pause):
                    # PF001, or a session-bound lease whose session we lost (it may live on in it,
                    # out of our reach: session_ended all the same, unless the server says more).
                    otherwise = NO_REASON if isinstance(err, LeaseLost) else SESSION_ENDED
                    rows = await self._status(self._connections, min(self._release_timeout, holding.renew_every))
                    self._declare(LOST, self._reason_of(rows, otherwise))
                    if holding.give_up_after(err):
                        # A session-bound lease whose session may live on, or the rest of a lost
                        # set (Holding.give_up_after): give it up by its token.
                        with contextlib.suppress(Exception):
                            await bounded(self._connections, self._release, self._release_timeout)
                    return
                continue
            if not holding.renewed(sent, renewed) and holding.state in (LOST, UNKNOWN):
                # Renewed after it was declared lost: nobody works under it now, so free the key.
                with contextlib.suppress(Exception):
                    await bounded(self._connections, self._release, self._release_timeout)
                return

    async def _renew(self, conn: psycopg.AsyncConnection) -> Held:
        # Scoped to the renewal's transaction, so a pool's connection goes back unchanged.
        async with conn.transaction():
            await conn.execute(*self._holding.statement_timeout())
            return await aio_calls.renew(conn, self._holding.lease, self._holding.ttl)

    async def _pause(self, holding: Holding) -> bool:
        """Waits until the next renewal is due; True when stopped. A session-bound lease's
        connection is watched meanwhile: the server writes to an idle session only when it ends
        it (pg_terminate_backend, a shutdown), and then the lease is gone, so renew at once to
        find out, instead of at the next renewal."""
        timeout = max(0.0, holding.next_renewal - clock())
        conn = self._connections.current() if holding.session_bound else None
        if conn is None or conn.closed:
            return await self._stop.wait(timeout)
        if await self._stop.wait(timeout, conn.fileno()):
            return True
        holding.next_renewal = min(holding.next_renewal, clock())
        return False


class AsyncKeptLeaseSet(SetView, AsyncKeptLease):
    """A lease set (Client.lease_set) kept as a lease is: renewed in one call for the whole set
    (lease_renew_all), lost as a whole when any of its leases is, released as a whole."""

    async def guard(self, conn: psycopg.AsyncConnection, key: str) -> None:  # type: ignore[override]
        """fence_guard of the set's lease on `key` in your transaction on `conn`, after a local check."""
        fence = self.fence_of(key)
        await self._fenced(lambda: aio_calls.fence_guard(conn, key, fence))

    async def fenced_update(  # type: ignore[override]
        self, conn: psycopg.AsyncConnection, key: str, table: str, changes: dict, filter: dict
    ) -> int:
        """fenced_update under the set's lease on `key`, in your transaction on `conn`."""
        fence = self.fence_of(key)
        return await self._fenced(lambda: aio_calls.fenced_update(conn, key, fence, table, changes, filter))
