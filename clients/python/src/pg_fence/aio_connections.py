"""The asyncio client's connections, as connections.py has the sync one's: a call past its limit
is cancelled, and its connection, in an unknown state then, is closed (or given back to the pool)
and replaced."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Awaitable, Callable, List, Optional, Set, TypeVar

import psycopg

from .errors import CallTimedOut, connecting, retryable
from .source import CANCEL_TIMEOUT, Source

T = TypeVar("T")


class AsyncConnections(Source):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._conn: Optional[psycopg.AsyncConnection] = None

    async def checkout(self) -> psycopg.AsyncConnection:
        if self.pool is not None and not self.pinned:
            with connecting():
                return await self.pool.getconn()
        if self._conn is None or self._conn.closed or self._conn.broken:
            await self.close()
            with connecting():
                if self.pool is None:
                    self._conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.kwargs)
                else:
                    self._conn = await self.pool.getconn()
                self._autocommit[id(self._conn)] = self._conn.autocommit
                await self._conn.set_autocommit(True)
        return self._conn

    async def checkin(self, conn: psycopg.AsyncConnection, failure: Optional[BaseException]) -> None:
        if self.pool is not None and not self.pinned:
            await self.pool.putconn(conn)
        elif failure is not None and (conn.broken or not isinstance(failure, Exception) or retryable(failure)):
            # Broken, cancelled mid-call, or a standby: a new connection for the next call.
            if self._conn is conn:
                await self.close()

    def current(self) -> Optional[psycopg.AsyncConnection]:
        return self._conn

    def forget(self, conn: psycopg.AsyncConnection) -> None:
        """Stops handing out `conn`: a call past its limit still runs on it."""
        if self._conn is conn:
            self._conn = None

    async def abandoned(self, conn: psycopg.AsyncConnection) -> None:
        """`conn` came back from a call that ran out of time, and no one else uses it now."""
        if self.pool is not None and not self.pinned:
            await self.pool.putconn(conn)
        else:
            await self._dispose(conn)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._dispose(conn)

    async def _dispose(self, conn: psycopg.AsyncConnection) -> None:
        if self.pool is None:
            with contextlib.suppress(Exception):
                await conn.close()
            return
        if not conn.broken and not conn.closed:
            with contextlib.suppress(Exception):
                await conn.execute("RESET statement_timeout")
                await conn.set_autocommit(self._autocommit.pop(id(conn), conn.autocommit))
        await self.pool.putconn(conn)


class AsyncLanes(Source):
    """A keeper's connections (keeping.py): at most `size` in use at once, of its own (made from the
    conninfo, never taken from the application's pool, so a busy pool cannot starve a renewal),
    kept open and reused. A call past its limit gives up its slot at once (forget), so the next
    call makes a new connection in time for the deadline, while the abandoned one is closed when
    its call returns. close() is a kept lease's: the lanes are the keeper's, shut by shut()."""

    def __init__(self, conninfo: str, size: int, **kwargs: Any):
        super().__init__(conninfo, None, pinned=True, **kwargs)
        self.size = size
        self._slots = asyncio.Semaphore(size)
        self._idle: List[psycopg.AsyncConnection] = []
        self._open: Set[psycopg.AsyncConnection] = set()
        self._shut = False
        #: Connections made since the keeper started: more than `size` only after a failure.
        self.made = 0
        self._opening = False

    async def checkout(self) -> psycopg.AsyncConnection:
        await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and not conn.broken:
                    return conn
                self._open.discard(conn)
            with connecting():
                conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.kwargs)
            self.made += 1
            self._open.add(conn)
            return conn
        except BaseException:
            self._slots.release()
            raise

    async def checkin(self, conn: psycopg.AsyncConnection, failure: Optional[BaseException]) -> None:
        if self._shut or (
            failure is not None and (conn.broken or not isinstance(failure, Exception) or retryable(failure))
        ):
            await self._dispose(conn)
        elif conn.closed:
            self._open.discard(conn)
        else:
            self._idle.append(conn)
        self._slots.release()

    async def open(self) -> None:
        """Makes the lanes' connections now, once: a renewal due later finds them open, even if
        the server has no connection slot left by then. A failure is left to the calls to meet."""
        if self._opening:
            return
        self._opening = True
        for _ in range(self.size):
            try:
                with connecting():
                    conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.kwargs)
            except Exception:
                return
            self.made += 1
            self._open.add(conn)
            self._idle.append(conn)

    def current(self) -> Optional[psycopg.AsyncConnection]:
        return None

    def forget(self, conn: psycopg.AsyncConnection) -> None:
        self._slots.release()
        # Those waiting idle may run over the same dead route: the next call makes a new one.
        stale, self._idle = self._idle, []
        for idle in stale:
            disposal = asyncio.ensure_future(self._dispose(idle))
            _abandoned.add(disposal)
            disposal.add_done_callback(_abandoned.discard)

    async def abandoned(self, conn: psycopg.AsyncConnection) -> None:
        await self._dispose(conn)

    def sibling(self, pinned: bool = False) -> "AsyncLanes":
        return self

    async def close(self) -> None:
        pass

    async def shut(self) -> None:
        """Closes the idle connections now; one a call is using is closed when that call hands it
        back: libpq's connection freed under a running call is used after free by it."""
        self._shut = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._dispose(conn)

    async def _dispose(self, conn: psycopg.AsyncConnection) -> None:
        self._open.discard(conn)
        with contextlib.suppress(Exception):
            await conn.close()


#: Calls past their limit, still being cancelled: a task the loop alone refers to may be collected.
_abandoned: Set["asyncio.Task[None]"] = set()


async def bounded(
    connections: AsyncConnections,
    call: Callable[[psycopg.AsyncConnection], Awaitable[T]],
    limit: Optional[float],
    *,
    cancel_on_interrupt: bool = False,
) -> T:
    """As connections.bounded: `call` in its own transaction, given `limit` seconds. A cancelled
    call's statement is cancelled whatever `cancel_on_interrupt` says: psycopg does it."""

    async def in_transaction(conn: psycopg.AsyncConnection) -> T:
        if conn.autocommit:
            return await call(conn)
        async with conn.transaction():
            return await call(conn)

    conn = await connections.checkout()
    running = asyncio.ensure_future(in_transaction(conn))
    try:
        await asyncio.wait((running,), timeout=limit)
    except BaseException as err:
        # Cancelled: so is the call, whose statement psycopg cancels on the server itself. Its
        # cancel waits for the server's answer, which a dead route never brings: waited for a
        # moment only, then the connection is abandoned, so the caller's clean-up (giving up its
        # token) starts at once.
        running.cancel()
        await asyncio.wait((running,), timeout=CANCEL_TIMEOUT)
        if not running.done():
            connections.forget(conn)
            _abandon(running, conn, connections)
            raise
        await connections.checkin(conn, err)
        raise
    if not running.done():
        # Not waited for: psycopg's cancel waits seconds more on a connection that carries nothing
        # (a dead route), and the caller must be free to try again on a new one at once.
        connections.forget(conn)
        running.cancel()
        _abandon(running, conn, connections)
        raise CallTimedOut(f"no answer from the server within {limit:.1f} s")
    try:
        result = running.result()
    except BaseException as err:
        await connections.checkin(conn, err)
        raise
    await connections.checkin(conn, None)
    return result


def _abandon(running: "asyncio.Future[Any]", conn: psycopg.AsyncConnection, connections: AsyncConnections) -> None:
    disposal = asyncio.ensure_future(_dispose_after(running, conn, connections))
    _abandoned.add(disposal)
    disposal.add_done_callback(_abandoned.discard)


async def _dispose_after(
    running: "asyncio.Future[Any]", conn: psycopg.AsyncConnection, connections: AsyncConnections
) -> None:
    with contextlib.suppress(BaseException):
        await running
    await connections.abandoned(conn)


async def cancel(conn: Optional[psycopg.AsyncConnection]) -> None:
    """As connections.cancel."""
    if conn is not None and not conn.closed:
        with contextlib.suppress(Exception):
            await conn.cancel_safe(timeout=CANCEL_TIMEOUT)
