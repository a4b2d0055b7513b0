"""The asyncio client's connections, as connections.py has the sync one's: a call past its limit
is cancelled, and its connection, in an unknown state then, is closed (or given back to the pool)
and replaced."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Awaitable, Callable, Optional, Set, TypeVar

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


#: Calls past their limit, still being cancelled: a task the loop alone refers to may be collected.
_abandoned: Set["asyncio.Task[None]"] = set()


async def bounded(
    connections: AsyncConnections, call: Callable[[psycopg.AsyncConnection], Awaitable[T]], limit: Optional[float]
) -> T:
    """As connections.bounded: `call` in its own transaction, given `limit` seconds."""

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
        # Cancelled: so is the call, whose statement psycopg cancels on the server itself.
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        await connections.checkin(conn, err)
        raise
    if not running.done():
        # Not waited for: psycopg's cancel waits seconds more on a connection that carries nothing
        # (a dead route), and the caller must be free to try again on a new one at once.
        connections.forget(conn)
        running.cancel()
        disposal = asyncio.ensure_future(_dispose_after(running, conn, connections))
        _abandoned.add(disposal)
        disposal.add_done_callback(_abandoned.discard)
        raise CallTimedOut(f"no answer from the server within {limit:.1f} s")
    try:
        result = running.result()
    except BaseException as err:
        await connections.checkin(conn, err)
        raise
    await connections.checkin(conn, None)
    return result


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
