"""A client's keeper: the few connections of its own over which every kept lease, leadership and
kept lease set of the client is renewed and released, and the renewals that are due sent together.

Each kept lease still keeps its own local deadline, pauses and told loss (aio_keeper.py): its
renewer hands the keeper its renewal and waits for the answer. The keeper's workers, one per
connection, take the renewals waiting (up to RENEW_MANY_LIMIT) and send them in one
lease_renew_many call, each lease getting its own answer; while both connections are busy, the
renewals that fall due meanwhile wait and go together in the next call, so a thousand leases cost
a few calls a round, not a thousand connections. A call is bounded by the shortest limit of the
renewals it carries: one that hangs is abandoned with its connection (AsyncLanes), the renewals it
carried fail as a hung renewal does today, and their next tries go on a new connection.

A call the caller gave up after sending its acquire (give_up) is released by its token here, in
the background, until done or its TTL has passed: nothing else knows that token any more."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any, List, Optional

import psycopg

from . import aio_calls
from .aio_connections import AsyncLanes, bounded
from .concurrency import AEvent, asleep, aspawn
from .errors import ConnectFailed, LeaseLost
from .holding import Holding, clock
from .lease import RENEW_MANY_LIMIT, Lease, Query, renew_many_query
from .observer import RENEW_LOST, RENEW_OK, Observer, Timed
from .retry import Retry

#: The keeper's connections unless the client says otherwise (Client(keeper_connections=...)).
KEEPER_CONNECTIONS = 2


class _Renewal:
    """A renewal waiting for the keeper, and its answer (the renewed Lease, or an error)."""

    def __init__(self, holding: Holding, limit: float):
        self.lease: Lease = holding.lease  # type: ignore[assignment]
        self.ttl = holding.ttl
        self.limit = limit
        self.statement_ms = max(1, int(holding.remaining() * 1000))
        self.queued = clock()
        if True:  # ASYNC
            self.answer: Any = asyncio.get_running_loop().create_future()
        else:
            self.answer = Future()

    def wanted(self) -> bool:
        return not self.answer.done()

    def settle(self, expires_at: Any, latencies: "deque[float]") -> None:
        if not self.wanted():
            return
        latencies.append(clock() - self.queued)
        if expires_at is None:
            self.answer.set_exception(LeaseLost(self.lease.key))
        else:
            self.answer.set_result(self.lease.renewed(expires_at))

    def fail(self, err: BaseException) -> None:
        if self.wanted():
            self.answer.set_exception(err)


class AsyncKeeper:
    """The keeper of one client (see the module's doc); its connections are made at its first use."""

    def __init__(self, lanes: AsyncLanes, retry: Retry):
        self.lanes = lanes
        self._retry = retry
        self._due: List[_Renewal] = []
        self._lock = threading.Lock()
        self._wake = AEvent()
        self._workers: List[Any] = []
        self._closed = False
        #: How long the latest renewals took, in seconds, from handed to the keeper to answered.
        self.latencies: "deque[float]" = deque(maxlen=100_000)
        self._background: set = set()  # give-ups under way: a task the loop alone refers to may be collected
        #: The client's observer (observer.py), told of each lease_renew_many call.
        self.observer: Optional[Observer] = None

    async def renew(self, holding: Holding, limit: float) -> Lease:
        """`holding`'s lease renewed with the next lease_renew_many call; LeaseLost when its token
        no longer holds it; CallTimedOut (or the failure) when the call carrying it failed."""
        renewal = _Renewal(holding, limit)
        with self._lock:
            if self._closed:
                raise ConnectFailed("the client is closed")
            self._due.append(renewal)
            self._start()
            self._wake.set()
        if True:  # ASYNC
            return await renewal.answer
        else:
            return renewal.answer.result()

    def _start(self) -> None:
        if not self._workers and not self._closed:
            self._workers = [aspawn(self._work, f"pg_fence keeper {n}") for n in range(self.lanes.size)]

    def _take(self) -> List[_Renewal]:
        with self._lock:
            batch = [renewal for renewal in self._due[:RENEW_MANY_LIMIT] if renewal.wanted()]
            del self._due[:RENEW_MANY_LIMIT]
            if not self._due:
                self._wake.clear()
        return batch

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            if self._closed:
                return
            batch = self._take()
            if not batch:
                continue
            with Timed(self.observer, "renew_finished", len(batch)) as timed:
                try:
                    rows = await bounded(
                        self.lanes, lambda conn: self._renew_many(conn, batch), min(r.limit for r in batch)
                    )
                except Exception as err:
                    for renewal in batch:
                        renewal.fail(err)
                    continue
                timed.outcome = RENEW_LOST if any(row[2] is None for row in rows) else RENEW_OK
                for renewal, row in zip(batch, rows):
                    renewal.settle(row[2], self.latencies)

    @staticmethod
    async def _renew_many(conn: psycopg.AsyncConnection, batch: List[_Renewal]) -> List[tuple]:
        # A renewal that takes longer than the time its lease has left is of no use; local to
        # the call's transaction.
        async with conn.transaction():
            await conn.execute(
                "SELECT set_config('statement_timeout', %s, true)", (str(min(r.statement_ms for r in batch)),)
            )
            return await aio_calls.rows(
                conn, renew_many_query([r.lease for r in batch], [r.ttl for r in batch]), batch[0].lease.key
            )

    def give_up(self, release: Query, ttl: float, limit: Optional[float]) -> None:
        """Releases by its token, in the background, what a given-up acquire may have been granted:
        tried on the keeper's connections until done or `ttl` has passed (the grant has ended then)."""
        end = clock() + ttl
        if True:  # ASYNC
            task = aspawn(lambda: self._release(release, end, limit), "pg_fence give up")
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:
            aspawn(lambda: self._release(release, end, limit), "pg_fence give up")

    async def release_now(self, release: Query, ttl: float, limit: Optional[float]) -> None:
        """Releases at once what a given-up acquire may have been granted, for a caller about to
        try again, whose next try would find the key still held by that grant; one try, bounded
        by `limit`, and on failure on in the background as give_up."""
        try:
            await bounded(self.lanes, lambda conn: aio_calls.one(conn, release, ""), limit or ttl)
        except Exception:
            self.give_up(release, ttl, limit)

    async def _release(self, release: Query, end: float, limit: Optional[float]) -> None:
        failures = 0
        while clock() < end and not self._closed:
            left = end - clock()
            try:
                await bounded(self.lanes, lambda conn: aio_calls.one(conn, release, ""), min(limit or left, left))
                return
            except Exception:
                await asleep(min(self._retry.pause(failures), max(0.0, end - clock())))
                failures += 1

    async def close(self) -> None:
        """Stops the workers and closes the keeper's connections; the leases kept are the
        client's to release first."""
        with self._lock:
            self._closed = True
            due, self._due = self._due, []
            self._wake.set()
        for renewal in due:
            renewal.fail(ConnectFailed("the client is closed"))
        if True:  # ASYNC
            for worker in self._workers:
                worker.cancel()
                with contextlib.suppress(BaseException):
                    await worker
            for task in list(self._background):
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 5)
        await self.lanes.shut()
