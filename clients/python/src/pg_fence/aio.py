"""The asyncio API: the same calls and kept leases as the sync one, on psycopg.AsyncConnection
(or a psycopg_pool.AsyncConnectionPool). The statements and the local-deadline rule are shared
(lease.py, holding.py); only the waiting differs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from typing import Any, Awaitable, Callable, Iterable, List, Mapping, Optional, Set, Tuple, TypeVar

import psycopg

from . import lease as q
from .connections import APPLICATION_NAME, CANCEL_TIMEOUT, Source
from .election import ElectorOptions
from .errors import CallTimedOut, LeaseLost, OutcomeUnknown, connecting, outcome_unknown, retryable, translate
from .holding import Holding, KeepPlan, clock
from .lease import Held, Lease, LeaseSet, Seconds, interval, new_token
from .reasons import UNKNOWN as NO_REASON
from .reasons import loss_reason
from .retry import Retry, Tries

T = TypeVar("T")
H = TypeVar("H", Lease, LeaseSet)


async def one(conn: psycopg.AsyncConnection, query: q.Query, key: str, waiting: bool = False) -> Optional[tuple]:
    try:
        return await (await conn.execute(*query)).fetchone()
    except psycopg.Error as err:
        raise translate(err, key, waiting=waiting) from err


async def rows(conn: psycopg.AsyncConnection, query: q.Query, key: str, waiting: bool = False) -> List[tuple]:
    try:
        return await (await conn.execute(*query)).fetchall()
    except psycopg.Error as err:
        raise translate(err, key, waiting=waiting) from err


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
    shared: bool = False,
    permits: int = 1,
    lock_delay: Seconds = 0,
) -> Optional[Lease]:
    request = q.Acquire(key, ttl, owner, wait, session_bound, durable, shared, permits, lock_delay)
    return await acquire_with(conn, request, token or new_token())


async def acquire_with(conn: psycopg.AsyncConnection, request: q.Acquire, token: Optional[uuid.UUID]) -> Any:
    return request.parse(await rows(conn, request.query(token), request.label, waiting=True))


async def acquire_all(
    conn: psycopg.AsyncConnection,
    keys: Iterable[str],
    ttl: Seconds,
    *,
    owner: Optional[str] = None,
    wait: Seconds = 0,
    session_bound: bool = False,
    durable: bool = True,
) -> Optional[LeaseSet]:
    return await acquire_with(conn, q.acquire_all_request(keys, ttl, owner, wait, session_bound, durable), None)


async def renew(conn: psycopg.AsyncConnection, lease: H, ttl: Seconds) -> H:
    row = await one(conn, lease.renew_query(ttl), lease.label)
    assert row is not None and row[0] is not None, "lease_renew returns a timestamp or raises"
    return lease.renewed(row[0])


async def renew_all(conn: psycopg.AsyncConnection, lease_set: LeaseSet, ttl: Seconds) -> LeaseSet:
    return await renew(conn, lease_set, ttl)


async def release(conn: psycopg.AsyncConnection, lease: Lease) -> bool:
    return await ended(conn, lease)


async def release_all(conn: psycopg.AsyncConnection, lease_set: LeaseSet) -> int:
    row = await one(conn, lease_set.release_query(), lease_set.label)
    return int(row[0]) if row and row[0] is not None else 0


async def ended(conn: psycopg.AsyncConnection, held: Held) -> bool:
    return held.ended(await one(conn, held.release_query(), held.label))


async def status(conn: psycopg.AsyncConnection, key: str, token: uuid.UUID) -> q.LeaseStatus:
    row = await one(conn, q.status_query(key, token), key)
    assert row is not None, "lease_status returns one row"
    return q.LeaseStatus(*row)


async def current_fence(conn: psycopg.AsyncConnection, key: str) -> Optional[int]:
    row = await one(conn, q.current_fence_query(key), key)
    return row[0] if row else None


async def fence_guard(conn: psycopg.AsyncConnection, key: str, fence: int) -> None:
    await one(conn, q.guard_query(key, fence), key)


async def fenced_update(
    conn: psycopg.AsyncConnection,
    key: str,
    fence: int,
    table: str,
    changes: Mapping[str, Any],
    filter: Mapping[str, Any],
) -> int:
    row = await one(conn, q.fenced_update_query(key, fence, table, changes, filter), key)
    return int(row[0]) if row else 0


class AsyncConnections(Source):
    """As connections.Connections, for asyncio: a call past its limit is cancelled, and its
    connection, in an unknown state then, is closed (or given back to the pool) and replaced."""

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


async def retrying(
    connections: AsyncConnections,
    retry: Retry,
    call: Callable[[psycopg.AsyncConnection], Awaitable[T]],
    limit: Optional[float],
    end: Optional[float] = None,
    resend: bool = True,
) -> T:
    """As connections.retrying."""
    tries = Tries(retry, end, resend)
    while True:
        try:
            return await bounded(connections, call, tries.limit(limit))
        except Exception as err:
            await asyncio.sleep(tries.pause_or_raise(err))


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
        call_timeout: Optional[float] = 30,
    ):
        self.conninfo, self.pool, self.retry = conninfo, pool, retry
        self.application_name, self.connect_timeout, self.call_timeout = application_name, connect_timeout, call_timeout
        self._connections = self.connections()

    def connections(self, pinned: bool = False) -> AsyncConnections:
        return AsyncConnections(
            self.conninfo,
            self.pool,
            pinned=pinned,
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
        )

    def _limit(self, wait: Seconds = 0) -> Optional[float]:
        return None if self.call_timeout is None else self.call_timeout + interval(wait).total_seconds()

    async def _call(self, call: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        return await retrying(self._connections, self.retry, call, self._limit())

    def elector(self, key: str, ttl: Seconds, **options: Any) -> "AsyncElector":
        """As Client.elector; call it in a coroutine."""
        return AsyncElector(self, ElectorOptions(key, ttl, **options))

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
        shared: bool = False,
        permits: int = 1,
        lock_delay: Seconds = 0,
    ) -> Optional[Lease]:
        request = q.Acquire(key, ttl, owner, wait, session_bound, durable, shared, permits, lock_delay)
        token = token or new_token()
        return await retrying(
            self._connections, self.retry, lambda conn: acquire_with(conn, request, token), self._limit(wait)
        )

    async def acquire_all(
        self,
        keys: Iterable[str],
        ttl: Seconds,
        *,
        owner: Optional[str] = None,
        wait: Seconds = 0,
        session_bound: bool = False,
        durable: bool = True,
    ) -> Optional[LeaseSet]:
        """As Client.acquire_all: a try whose connection broke mid-call is not sent again."""
        request = q.acquire_all_request(keys, ttl, owner, wait, session_bound, durable)
        call = functools.partial(acquire_with, request=request, token=None)
        return await retrying(self._connections, self.retry, call, self._limit(wait), resend=False)

    async def renew(self, lease: Lease, ttl: Seconds) -> Lease:
        """As Client.renew."""
        return await self._renewing(lease, lambda conn: renew(conn, lease, ttl))

    async def renew_all(self, lease_set: LeaseSet, ttl: Seconds) -> LeaseSet:
        return await self._renewing(lease_set, lambda conn: renew_all(conn, lease_set, ttl))

    async def _renewing(self, held: H, call: Callable[[psycopg.AsyncConnection], Awaitable[H]]) -> H:
        try:
            return await self._call(call)
        except LeaseLost as lost:
            with contextlib.suppress(Exception):
                found = await bounded(
                    self._connections, lambda conn: rows(conn, held.status_query(), ""), self._limit()
                )
                lost.reason = loss_reason(found, held.durable, NO_REASON)
            raise

    async def status(self, key: str, token: uuid.UUID) -> q.LeaseStatus:
        """As Client.status."""
        return await self._call(lambda conn: status(conn, key, token))

    async def release(self, lease: Lease) -> bool:
        return await self._call(lambda conn: release(conn, lease))

    async def release_all(self, lease_set: LeaseSet) -> int:
        return await self._call(lambda conn: release_all(conn, lease_set))

    async def current_fence(self, key: str) -> Optional[int]:
        return await self._call(lambda conn: current_fence(conn, key))

    async def lease(
        self,
        key: str,
        ttl: Seconds,
        *,
        wait: Seconds = 0,
        owner: Optional[str] = None,
        session_bound: bool = False,
        durable: bool = True,
        shared: bool = False,
        permits: int = 1,
        lock_delay: Seconds = 0,
        renew_every: Optional[Seconds] = None,
        margin: Seconds = 0,
        on_lost: Optional[Callable[[Any], Any]] = None,
        release_timeout: Seconds = 5,
    ) -> "AsyncKeptLease":
        """`async with await client.lease(...) as lease:`; as Client.lease."""
        request = q.Acquire(key, ttl, owner, wait, session_bound, durable, shared, permits, lock_delay)
        return await self._keep(AsyncKeptLease, KeepPlan(request, renew_every, margin, release_timeout), on_lost)

    async def lease_set(
        self,
        keys: Iterable[str],
        ttl: Seconds,
        *,
        wait: Seconds = 0,
        owner: Optional[str] = None,
        session_bound: bool = False,
        durable: bool = True,
        renew_every: Optional[Seconds] = None,
        margin: Seconds = 0,
        on_lost: Optional[Callable[[Any], Any]] = None,
        release_timeout: Seconds = 5,
    ) -> "AsyncKeptLeaseSet":
        """`async with await client.lease_set(...) as leases:`; as Client.lease_set."""
        request = q.acquire_all_request(keys, ttl, owner, wait, session_bound, durable)
        return await self._keep(AsyncKeptLeaseSet, KeepPlan(request, renew_every, margin, release_timeout), on_lost)

    async def _keep(
        self,
        kept: Any,
        plan: KeepPlan,
        on_lost: Optional[Callable[[Any], Any]],
        connections: Optional[AsyncConnections] = None,
    ) -> Any:
        """As Client._keep."""
        connections = connections or self.connections(pinned=True)
        try:
            holding = plan.holding(*await self._acquire_to_keep(connections, plan.request))
            if holding.anchored_long_ago():
                await self._renew_now(connections, holding)
        except BaseException:
            await connections.close()
            raise
        return kept(holding, connections, self.retry, on_lost, plan.release_timeout)

    async def _acquire_to_keep(self, connections: AsyncConnections, request: q.Acquire) -> Tuple[Optional[Held], float]:
        """As Client._acquire_to_keep."""
        anchor = clock()
        if isinstance(request, q.AcquireAll):
            call = functools.partial(acquire_with, request=request, token=None)
            return await retrying(connections, self.retry, call, self._limit(request.wait), resend=False), anchor
        tries, token = Tries(self.retry), new_token()
        while True:
            try:
                call = functools.partial(acquire_with, request=request, token=token)
                return await bounded(connections, call, self._limit(request.wait)), anchor
            except BaseException as err:
                if isinstance(err, asyncio.CancelledError):
                    # Cancelled (psycopg cancelled the statement on the server): give up what its
                    # token may have been granted.
                    await self._give_up(connections, q.release_query(request.key, token))
                    raise
                try:
                    pause = tries.pause_or_raise(err)
                except OutcomeUnknown as unknown:
                    await self._give_up(connections, q.release_query(request.key, token))
                    unknown.token = token
                    raise
                if request.session_bound and outcome_unknown(err):
                    await self._give_up(connections, q.release_query(request.key, token))
                    token, anchor = new_token(), None
                await asyncio.sleep(pause)
                anchor = clock() if anchor is None else anchor

    async def _renew_now(self, connections: AsyncConnections, holding: Holding) -> None:
        sent = clock()
        try:
            renewed = await bounded(connections, lambda conn: renew(conn, holding.lease, holding.ttl), self._limit())
        except BaseException:
            await self._give_up(connections, holding.lease.release_query())
            raise
        holding.renewed(sent, renewed)

    async def _give_up(self, connections: AsyncConnections, release: q.Query) -> None:
        with contextlib.suppress(Exception):
            await bounded(connections, lambda conn: one(conn, release, ""), self._limit())

    async def close(self) -> None:
        await self._connections.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


from .aio_elector import AsyncElector  # noqa: E402
from .aio_keeper import AsyncKeptLease, AsyncKeptLeaseSet  # noqa: E402 (it builds on the calls above)
