"""As keeper.py, for asyncio: a renewer task and a deadline task. A renewal past its limit is
cancelled and its connection replaced; the deadline task does not wait for any of it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Awaitable, Callable, List, Optional, TypeVar

import psycopg

from .aio import AsyncConnections, bounded, ended, fence_guard, fenced_update, renew, retrying, rows
from .errors import LeaseLost, StaleFence
from .holding import HELD, LOST, UNKNOWN, Holding, clock
from .kept import Kept, SetView
from .reasons import SESSION_ENDED, ended_reason
from .reasons import UNKNOWN as NO_REASON
from .retry import Retry

T = TypeVar("T")


class AsyncKeptLease(Kept):
    """As pg_fence.KeptLease; `lost` is an asyncio.Event."""

    def __init__(
        self,
        holding: Holding,
        connections: AsyncConnections,
        retry: Retry,
        on_lost: Optional[Callable[["AsyncKeptLease"], Any]],
        release_timeout: float,
    ):
        self._holding, self._connections, self._retry = holding, connections, retry
        self._on_lost, self._release_timeout = on_lost, release_timeout
        self.lost = asyncio.Event()
        # As KeptLease._renewing.
        self._renewing = asyncio.Lock()
        self._renewer = asyncio.create_task(self._renew_loop())
        self._watchdog = asyncio.create_task(self._watch())

    async def guard(self, conn: psycopg.AsyncConnection) -> None:
        await self._fenced(lambda: fence_guard(conn, self.key, self.fence))

    async def fenced_update(self, conn: psycopg.AsyncConnection, table: str, changes: dict, filter: dict) -> int:
        return await self._fenced(lambda: fenced_update(conn, self.key, self.fence, table, changes, filter))

    async def _fenced(self, call: Callable[[], Awaitable[T]]) -> T:
        """As KeptLease._fenced."""
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
        """As KeptLease._status."""
        with contextlib.suppress(Exception):
            return await bounded(connections, lambda conn: rows(conn, self._status_query(), ""), limit)
        return None

    async def release(self) -> bool:
        """As KeptLease.release."""
        end = time.monotonic() + self._release_timeout
        wanted = self._holding.release_wanted()
        for task in (self._watchdog, self._renewer):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        answer = None
        if wanted:
            with contextlib.suppress(Exception):
                answer = await retrying(self._connections, self._retry, self._release, None, end)
            status = await self._status(self._connections, self._release_timeout) if answer is False else None
            self._released_as(answer, ended_reason(status or (), self.lease.durable))
        await self._connections.close()
        return bool(answer)

    async def __aenter__(self) -> "AsyncKeptLease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def _release(self, conn: psycopg.AsyncConnection) -> bool:
        return await ended(conn, self._holding.lease)

    def _stop_renewing(self) -> None:
        if asyncio.current_task() is not self._renewer:
            self._renewer.cancel()

    async def _watch(self) -> None:
        while self._holding.remaining() > 0:
            await asyncio.sleep(self._holding.remaining())
        self._declare(UNKNOWN)

    async def _renew_loop(self) -> None:
        holding = self._holding
        while holding.state == HELD:
            await self._pause(holding)
            sent = clock()
            try:
                async with self._renewing:
                    if holding.state != HELD:
                        return  # handed off meanwhile
                    renewed = await bounded(self._connections, self._renew, holding.attempt_limit())
            except Exception as err:
                if holding.renewal_failed(err, self._retry.pause):
                    # As in KeptLease.
                    otherwise = NO_REASON if isinstance(err, LeaseLost) else SESSION_ENDED
                    status = await self._status(self._connections, min(self._release_timeout, holding.renew_every))
                    self._declare(LOST, self._reason_of(status, otherwise))
                    if holding.give_up_after(err):
                        # As in KeptLease (Holding.give_up_after).
                        with contextlib.suppress(Exception):
                            await bounded(self._connections, self._release, self._release_timeout)
                    return
                continue
            holding.renewed(sent, renewed)

    async def _renew(self, conn: psycopg.AsyncConnection):
        async with conn.transaction():
            await conn.execute(*self._holding.statement_timeout())
            return await renew(conn, self._holding.lease, self._holding.ttl)

    async def _pause(self, holding: Holding) -> None:
        """As KeptLease._pause: sleeps until the next renewal, watching a session-bound lease's
        connection, which the server writes to while idle only when it ends the session."""
        timeout = max(0.0, holding.next_renewal - clock())
        conn = self._connections.current() if holding.session_bound else None
        if conn is None or conn.closed:
            await asyncio.sleep(timeout)
            return
        loop, fd = asyncio.get_running_loop(), conn.fileno()
        readable = loop.create_future()
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await asyncio.wait_for(readable, timeout)
            holding.next_renewal = min(holding.next_renewal, clock())
        except asyncio.TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)


class AsyncKeptLeaseSet(SetView, AsyncKeptLease):
    """As pg_fence.KeptLeaseSet."""

    async def guard(self, conn: psycopg.AsyncConnection, key: str) -> None:  # type: ignore[override]
        fence = self.fence_of(key)
        await self._fenced(lambda: fence_guard(conn, key, fence))

    async def fenced_update(  # type: ignore[override]
        self, conn: psycopg.AsyncConnection, key: str, table: str, changes: dict, filter: dict
    ) -> int:
        fence = self.fence_of(key)
        return await self._fenced(lambda: fenced_update(conn, key, fence, table, changes, filter))
