"""The asyncio API: the same calls and kept leases as the sync one, on psycopg.AsyncConnection
(or a psycopg_pool.AsyncConnectionPool). The statements and the local-deadline rule are shared
(lease.py, holding.py); only the waiting differs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, Mapping, Optional, TypeVar

import psycopg

from . import lease as q
from .connections import APPLICATION_NAME, connect_kwargs
from .errors import LeaseLost, WaitTimedOut, translate
from .holding import HELD, LOST, RELEASED, UNKNOWN, Holding
from .lease import Lease, Seconds, interval, new_token
from .retry import Retry, pause_or_raise

T = TypeVar("T")
log = logging.getLogger("pg_fence")


async def _one(conn: psycopg.AsyncConnection, query: q.Query, key: str) -> Optional[tuple]:
    try:
        return await (await conn.execute(*query)).fetchone()
    except psycopg.Error as err:
        raise translate(err, key) from err


async def acquire(
    conn: psycopg.AsyncConnection,
    key: str,
    ttl: Seconds,
    *,
    owner: Optional[str] = None,
    wait: Seconds = 0,
    session_bound: bool = False,
    durable: bool = True,
    token: Optional[uuid.UUID] = None,
) -> Optional[Lease]:
    query = q.acquire_query(key, ttl, owner, wait, session_bound, durable, token or new_token())
    return q.parse_acquire(await _one(conn, query, key), durable)


async def renew(conn: psycopg.AsyncConnection, lease: Lease, ttl: Seconds) -> Lease:
    row = await _one(conn, q.renew_query(lease, ttl), lease.key)
    assert row is not None and row[0] is not None, "lease_renew returns a timestamp or raises"
    return lease.renewed(row[0])


async def release(conn: psycopg.AsyncConnection, lease: Lease) -> bool:
    row = await _one(conn, q.release_query(lease), lease.key)
    return bool(row and row[0])


async def current_fence(conn: psycopg.AsyncConnection, key: str) -> Optional[int]:
    row = await _one(conn, q.current_fence_query(key), key)
    return row[0] if row else None


async def fence_guard(conn: psycopg.AsyncConnection, key: str, fence: int) -> None:
    await _one(conn, q.guard_query(key, fence), key)


async def fenced_update(
    conn: psycopg.AsyncConnection,
    key: str,
    fence: int,
    table: str,
    changes: Mapping[str, Any],
    filter: Mapping[str, Any],
) -> int:
    row = await _one(conn, q.fenced_update_query(key, fence, table, changes, filter), key)
    return int(row[0]) if row else 0


class AsyncConnections:
    """As connections.Connections, for asyncio."""

    def __init__(self, conninfo: str, pool: Any, *, pinned: bool, application_name: str, connect_timeout: float):
        self.conninfo, self.pool, self.pinned = conninfo, pool, pinned
        self.kwargs = connect_kwargs(application_name, connect_timeout)
        self._conn: Optional[psycopg.AsyncConnection] = None
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def use(self):
        if self.pool is not None and not self.pinned:
            async with self.pool.connection() as conn:
                yield conn
            return
        async with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                await self._drop()
                if self.pool is not None:
                    self._conn = await self.pool.getconn()
                else:
                    self._conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.kwargs)
            try:
                yield self._conn
            finally:
                if self._conn.broken:
                    await self._drop()

    def current(self) -> Optional[psycopg.AsyncConnection]:
        return self._conn

    async def close(self) -> None:
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.pool is not None:
            await self.pool.putconn(conn)
        else:
            with contextlib.suppress(Exception):
                await conn.close()


async def retrying(
    connections: AsyncConnections, retry: Retry, call: Callable[[psycopg.AsyncConnection], Awaitable[T]]
) -> T:
    pauses = retry.pauses()
    while True:
        try:
            async with connections.use() as conn:
                if conn.autocommit:
                    return await call(conn)
                async with conn.transaction():
                    return await call(conn)
        except Exception as err:
            await asyncio.sleep(pause_or_raise(err, pauses))


class AsyncClient:
    """As pg_fence.Client, for asyncio."""

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: Any = None,
        retry: Retry = Retry(),
        application_name: str = APPLICATION_NAME,
        connect_timeout: float = 5,
    ):
        self.conninfo, self.pool, self.retry = conninfo, pool, retry
        self.application_name, self.connect_timeout = application_name, connect_timeout
        self._connections = self.connections()

    def connections(self, pinned: bool = False) -> AsyncConnections:
        return AsyncConnections(
            self.conninfo,
            self.pool,
            pinned=pinned,
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
        )

    async def acquire(
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
        token = token or new_token()
        return await retrying(
            self._connections,
            self.retry,
            lambda conn: acquire(
                conn, key, ttl, owner=owner, wait=wait, session_bound=session_bound, durable=durable, token=token
            ),
        )

    async def renew(self, lease: Lease, ttl: Seconds) -> Lease:
        return await retrying(self._connections, self.retry, lambda conn: renew(conn, lease, ttl))

    async def release(self, lease: Lease) -> bool:
        return await retrying(self._connections, self.retry, lambda conn: release(conn, lease))

    async def current_fence(self, key: str) -> Optional[int]:
        return await retrying(self._connections, self.retry, lambda conn: current_fence(conn, key))

    async def lease(
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
        on_lost: Optional[Callable[["AsyncKeptLease"], Any]] = None,
        release_timeout: Seconds = 5,
    ) -> "AsyncKeptLease":
        """`async with await client.lease(...) as lease:`; as Client.lease."""
        connections = self.connections(pinned=True)
        token, sent = new_token(), time.monotonic()
        try:
            lease = await retrying(
                connections,
                self.retry,
                lambda conn: acquire(
                    conn, key, ttl, owner=owner, wait=wait, session_bound=session_bound, durable=durable, token=token
                ),
            )
        except BaseException:
            await connections.close()
            raise
        if lease is None:
            await connections.close()
            raise WaitTimedOut(f"lease on {key!r} not granted within {interval(wait)}")
        holding = Holding(
            lease,
            interval(ttl).total_seconds(),
            sent,
            None if renew_every is None else interval(renew_every).total_seconds(),
            interval(margin).total_seconds(),
            session_bound,
        )
        return AsyncKeptLease(holding, connections, self.retry, on_lost, interval(release_timeout).total_seconds())

    async def close(self) -> None:
        await self._connections.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncKeptLease:
    """As pg_fence.KeptLease; `lost` is an asyncio.Event. The deadline is its own task, so that a
    renewal hung on a stopped server does not hold it up."""

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
        holding.renew_at_once_if_slow()
        self._renewer = asyncio.create_task(self._renew_loop())
        self._watchdog = asyncio.create_task(self._watch())

    lease = property(lambda self: self._holding.lease)
    key = property(lambda self: self._holding.lease.key)
    fence = property(lambda self: self._holding.lease.fence)
    token = property(lambda self: self._holding.lease.token)
    lost_at = property(lambda self: self._holding.lost_at)
    deadline = property(lambda self: self._holding.deadline)
    last_error = property(lambda self: self._holding.last_error)

    @property
    def state(self) -> str:
        if self._holding.state == HELD and self._holding.remaining() <= 0:
            self._declare(UNKNOWN)
        return self._holding.state

    def held(self) -> bool:
        return self.state == HELD

    def check(self) -> None:
        state = self.state
        if state != HELD:
            raise LeaseLost(self.key, f"lease on {self.key!r} is {state}", state=state)

    async def guard(self, conn: psycopg.AsyncConnection) -> None:
        self.check()
        await fence_guard(conn, self.key, self.fence)

    async def fenced_update(self, conn: psycopg.AsyncConnection, table: str, changes: dict, filter: dict) -> int:
        self.check()
        return await fenced_update(conn, self.key, self.fence, table, changes, filter)

    async def release(self) -> bool:
        was_held = self._holding.declare(RELEASED)
        self._watchdog.cancel()
        self._renewer.cancel()
        released = False
        if was_held:
            with contextlib.suppress(Exception):
                released = await asyncio.wait_for(self._release_once(), self._release_timeout)
        await self._connections.close()
        return released

    async def _release_once(self) -> bool:
        async with self._connections.use() as conn:
            return await release(conn, self.lease)

    async def __aenter__(self) -> "AsyncKeptLease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def _declare(self, state: str) -> None:
        if not self._holding.declare(state):
            return
        self.lost.set()
        self._renewer.cancel()
        log.warning("pg_fence: lease on %r %s", self.key, "lost" if state == LOST else "state unknown")
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("pg_fence: on_lost callback failed")

    async def _watch(self) -> None:
        while self._holding.remaining() > 0:
            await asyncio.sleep(self._holding.remaining())
        self._declare(UNKNOWN)

    async def _renew_loop(self) -> None:
        holding = self._holding
        while holding.state == HELD:
            await self._pause(holding)
            sent = time.monotonic()
            try:
                async with self._connections.use() as conn:
                    await conn.execute(*holding.statement_timeout())
                    renewed = await renew(conn, holding.lease, holding.ttl)
            except Exception as err:
                if holding.renewal_failed(err, self._retry.pause):
                    self._declare(LOST)
                    return
                continue
            holding.renewed(sent, renewed)

    async def _pause(self, holding: Holding) -> None:
        """As KeptLease._pause: sleeps until the next renewal, watching a session-bound lease's
        connection, which the server writes to while idle only when it ends the session."""
        timeout = max(0.0, holding.next_renewal - time.monotonic())
        conn = self._connections.current() if holding.session_bound else None
        if conn is None or conn.closed:
            await asyncio.sleep(timeout)
            return
        loop, fd = asyncio.get_running_loop(), conn.fileno()
        readable = loop.create_future()
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await asyncio.wait_for(readable, timeout)
            holding.next_renewal = min(holding.next_renewal, time.monotonic())
        except asyncio.TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)
