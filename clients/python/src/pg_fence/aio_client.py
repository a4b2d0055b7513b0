"""The client: calls that retry a broken connection, kept leases, and electors."""

from __future__ import annotations

import contextlib
import functools
import uuid
from typing import Any, Awaitable, Callable, Iterable, Optional, TypeVar

import psycopg

from . import aio_calls
from .aio_caller import AsyncCaller, retrying
from .aio_connections import bounded
from .aio_elector import AsyncElector
from .aio_keeper import AsyncKeptLease, AsyncKeptLeaseSet
from .election import ElectorOptions
from .errors import LeaseLost, WaitTimedOut
from .holding import KeepPlan
from .lease import (
    Acquire,
    Lease,
    LeaseSet,
    LeaseStatus,
    Seconds,
    acquire_all_request,
    acquire_any_request,
    new_token,
)
from .observer import Timed
from .reasons import UNKNOWN as NO_REASON
from .reasons import loss_reason

H = TypeVar("H", Lease, LeaseSet)


class AsyncClient(AsyncCaller):
    """pg_fence through a conninfo (`Client("host=... dbname=...")`) or a psycopg_pool pool
    (`Client(pool=pool)`). Thread-safe. Acquires carry a client-drawn token, so a retry after a
    lost reply gets the lease that reply granted. Each try of a call waits `call_timeout` seconds
    at most (beyond an acquire's `wait`): a stopped server answers nothing."""

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
        """The lease on `key`, or None when it cannot be granted now (and `wait` ran out). A
        session-bound lease is bound to the session of the try that got it, which may not be this
        client's connection after a retry: keep session-bound leases with lease()."""
        request = Acquire(key, ttl, owner, wait, session_bound, durable, shared, permits, lock_delay)
        token = token or new_token()
        with Timed(self.observer, "acquire_finished") as timed:
            return timed.granted(await self._call(lambda conn: aio_calls.acquire_with(conn, request, token), wait))

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
        """Every key of `keys` or none (None). lease_acquire_all takes no token, so a try whose
        connection broke mid-call is not sent again: OutcomeUnknown (the set may have been granted,
        and is then held until its TTL). Tries that reached no server are retried."""
        request = acquire_all_request(keys, ttl, owner, wait, session_bound, durable)
        call = functools.partial(aio_calls.acquire_with, request=request, token=None)
        with Timed(self.observer, "acquire_finished") as timed:
            return timed.granted(await retrying(self._connections, self.retry, call, self._limit(wait), resend=False))

    async def renew(self, lease: Lease, ttl: Seconds) -> Lease:
        """The lease with its new expiry; LeaseLost, with its `reason` (pg_fence.reasons), when its
        token no longer holds it."""
        return await self._renewing(lease, lambda conn: aio_calls.renew(conn, lease, ttl))

    async def renew_all(self, lease_set: LeaseSet, ttl: Seconds) -> LeaseSet:
        return await self._renewing(lease_set, lambda conn: aio_calls.renew_all(conn, lease_set, ttl))

    async def _renewing(self, held: H, call: Callable[[psycopg.AsyncConnection], Awaitable[H]]) -> H:
        try:
            return await self._call(call)
        except LeaseLost as lost:
            with contextlib.suppress(Exception):
                rows = await bounded(
                    self._connections, lambda conn: aio_calls.rows(conn, held.status_query(), ""), self._limit()
                )
                lost.reason = loss_reason(rows, held.durable, NO_REASON)
            raise

    async def status(self, key: str, token: uuid.UUID) -> LeaseStatus:
        """fence.lease_status: whether the lease `token` was granted on `key` is live, or why it ended."""
        return await self._call(lambda conn: aio_calls.status(conn, key, token))

    async def release(self, lease: Lease) -> bool:
        return await self._call(lambda conn: aio_calls.release(conn, lease))

    async def release_all(self, lease_set: LeaseSet) -> int:
        return await self._call(lambda conn: aio_calls.release_all(conn, lease_set))

    async def current_fence(self, key: str) -> Optional[int]:
        return await self._call(lambda conn: aio_calls.current_fence(conn, key))

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
        on_lost: Optional[Callable[[AsyncKeptLease], None]] = None,
        release_timeout: Seconds = 5,
    ) -> AsyncKeptLease:
        """Acquires `key` and keeps it renewed in the background on a connection of its own;
        WaitTimedOut when it is not granted within `wait`. Use it as a context manager, which
        releases on exit (`async with await client.lease(...)` in pg_fence.aio); watch `lease.lost`
        (or pass `on_lost`) to learn that it was lost."""
        request = Acquire(key, ttl, owner, wait, session_bound, durable, shared, permits, lock_delay)
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
        on_lost: Optional[Callable[[AsyncKeptLease], None]] = None,
        release_timeout: Seconds = 5,
    ) -> AsyncKeptLeaseSet:
        """As lease(), for every key of `keys` or none (lease_acquire_all): kept as one, renewed in
        one call (lease_renew_all), lost as one when any of its leases is. An acquire whose
        connection broke mid-call is not tried again (see acquire_all): OutcomeUnknown."""
        request = acquire_all_request(keys, ttl, owner, wait, session_bound, durable)
        return await self._keep(AsyncKeptLeaseSet, KeepPlan(request, renew_every, margin, release_timeout), on_lost)

    async def acquire_first_free(
        self,
        keys: Iterable[str],
        ttl: Seconds,
        *,
        owner: Optional[str] = None,
        session_bound: bool = False,
        durable: bool = True,
        token: Optional[uuid.UUID] = None,
    ) -> Optional[Lease]:
        """An exclusive lease on the first key of `keys`, in order, that is free now
        (lease_acquire_any: never waits, as SKIP LOCKED), or None when none is."""
        request = acquire_any_request(keys, ttl, owner, session_bound, durable)
        token = token or new_token()
        with Timed(self.observer, "acquire_finished") as timed:
            return timed.granted(await self._call(lambda conn: aio_calls.acquire_with(conn, request, token)))

    async def lease_first_free(
        self,
        keys: Iterable[str],
        ttl: Seconds,
        *,
        owner: Optional[str] = None,
        session_bound: bool = False,
        durable: bool = True,
        renew_every: Optional[Seconds] = None,
        margin: Seconds = 0,
        on_lost: Optional[Callable[[AsyncKeptLease], None]] = None,
        release_timeout: Seconds = 5,
    ) -> Optional[AsyncKeptLease]:
        """As lease(), on the first key of `keys`, in order, that is free now, in one round trip
        (acquire_first_free); None when none is, and then nothing is held. `lease.key` says which."""
        request = acquire_any_request(keys, ttl, owner, session_bound, durable)
        try:
            return await self._keep(AsyncKeptLease, KeepPlan(request, renew_every, margin, release_timeout), on_lost)
        except WaitTimedOut:
            return None

    def elector(self, key: str, ttl: Seconds, **options: Any) -> AsyncElector:
        """Leader election on `key` (README, Leader election; the options are ElectorOptions'):
        campaign(value) waits until elected and keeps the leadership as lease() keeps a lease
        (renewed, lost with its reason); observe() yields every change of leader; callbacks
        on_started_leading(leadership), on_stopped_leading(reason) and on_new_leader(leader or
        None), the last from a thread (pg_fence.aio: a task, so call elector() in a coroutine) of
        its own that observes while the elector is open."""
        return AsyncElector(self, ElectorOptions(key, ttl, **options))

    async def close(self) -> None:
        """Closes the client's connection and its keeper's (release the leases it keeps first)."""
        if self._keeper is not None:
            await self._keeper.close()
        await self._connections.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
