"""How a client's calls run, under its API: on connections of one source, each try bounded, tried
again on a new connection after a broken one; and how a lease is acquired to be kept. The client
builds on it, and so does the elector, which campaigns as the client's lease() acquires."""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable, Optional, Tuple, TypeVar

import psycopg

from . import aio_calls
from .aio_connections import AsyncConnections, AsyncLanes, bounded
from .aio_keeping import KEEPER_CONNECTIONS, AsyncKeeper
from .concurrency import asleep
from .errors import OutcomeUnknown, outcome_unknown
from .holding import Holding, KeepPlan, clock
from .kept import Kept
from .lease import Acquire, AcquireAll, Held, Seconds, give_up_query, interval, new_token
from .observer import Observer, Timed
from .retry import Retry, Tries
from .source import APPLICATION_NAME

T = TypeVar("T")
K = TypeVar("K", bound=Kept)


async def retrying(
    connections: AsyncConnections,
    retry: Retry,
    call: Callable[[psycopg.AsyncConnection], Awaitable[T]],
    limit: Optional[float],
    end: Optional[float] = None,
    resend: bool = True,
) -> T:
    """`call` in its own transaction, each try given `limit` seconds, tried again on a new
    connection while the failure is a broken connection, none made, no answer in time, or a
    standby (25006), until the tries run out or `end` (time.monotonic()) passes; OutcomeUnknown
    when they run out after one that may have taken effect, or at once after such a try when
    `resend` is false (a call that cannot be sent again safely: lease_acquire_all)."""
    tries = Tries(retry, end, resend)
    while True:
        try:
            return await bounded(connections, call, tries.limit(limit))
        except Exception as err:
            await asleep(tries.pause_or_raise(err))


class AsyncCaller:
    """A client's connections, retries and time limits (see AsyncClient); the calls that retry, and
    the kept lease's acquire."""

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: Any = None,
        retry: Retry = Retry(),
        application_name: str = APPLICATION_NAME,
        connect_timeout: float = 5,
        call_timeout: Optional[float] = 30,
        keeper_connections: int = KEEPER_CONNECTIONS,
        observer: Optional[Observer] = None,
    ):
        self.conninfo = conninfo
        #: Told of the client's acquires, renewals, kept leases, losses and leaderships
        #: (observer.py; pg_fence.prometheus has one). Set it before the first call.
        self.observer = observer
        self.pool = pool
        self.retry = retry
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._connections = self.connections()
        if isinstance(keeper_connections, bool) or not isinstance(keeper_connections, int) or keeper_connections < 1:
            raise ValueError(f"keeper_connections must be an int of at least 1, not {keeper_connections!r}")
        self.keeper_connections = keeper_connections
        self._keeper: Optional[AsyncKeeper] = None

    def keeper(self) -> AsyncKeeper:
        """The client's keeper (aio_keeping.py), made at its first use: its connections carry the
        application_name of the client's with " keeper" after it."""
        if self._keeper is None:
            conninfo = self.conninfo or (getattr(self.pool, "conninfo", "") if self.pool is not None else "")
            lanes = AsyncLanes(
                conninfo,
                self.keeper_connections,
                application_name=f"{self.application_name} keeper",
                connect_timeout=self.connect_timeout,
            )
            self._keeper = AsyncKeeper(lanes, self.retry)
            self._keeper.observer = self.observer
        return self._keeper

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

    async def _call(self, call: Callable[[psycopg.AsyncConnection], Awaitable[T]], wait: Seconds = 0) -> T:
        """`call` on the client's connection, retried."""
        return await retrying(self._connections, self.retry, call, self._limit(wait))

    async def _keep(
        self,
        kept: Callable[..., K],
        plan: KeepPlan,
        on_lost: Optional[Callable[[Any], None]],
        connections: Optional[AsyncConnections] = None,
    ) -> K:
        """Acquires as `plan` asks, on `connections` (the caller's own: the client's pool or
        connection by default), and keeps it as a `kept` (a kept lease's class: the sync or asyncio
        KeptLease, KeptLeaseSet or Leadership) on the keeper's connections. A session-bound lease's
        session is the lease: it is acquired on a connection of its own and keeps it."""
        session_bound = plan.request.session_bound
        if connections is None:
            connections = self.connections(pinned=True) if session_bound else self._connections
        keeper = self.keeper()
        try:
            with Timed(self.observer, "acquire_finished") as timed:
                granted, anchor = await self._acquire_to_keep(connections, plan.request, plan.ttl)
                timed.granted(granted)
            holding = plan.holding(granted, anchor)
            if holding.anchored_long_ago():
                await self._renew_now(connections if session_bound else keeper.lanes, holding)
        except BaseException:
            if connections is not self._connections:
                await connections.close()
            raise
        if session_bound:
            return self._observed(kept(holding, connections, self.retry, on_lost, plan.release_timeout))
        try:
            await keeper.lanes.open()
        except BaseException:
            # Interrupted: the lease was granted, and nobody will keep it.
            keeper.give_up(holding.lease.release_query(), holding.ttl, self._limit())
            raise
        if connections is not self._connections:
            await connections.close()  # a campaign's own, for a waiting acquire that close() can cancel
        return self._observed(kept(holding, keeper.lanes, self.retry, on_lost, plan.release_timeout, keeper))

    def _observed(self, kept: K) -> K:
        """`kept`, told to the observer as a kept lease."""
        kept._holding.observe(self.observer, kept)
        return kept

    async def _acquire_to_keep(
        self, connections: AsyncConnections, request: Acquire, ttl: float
    ) -> Tuple[Optional[Held], float]:
        """The lease and the instant its deadline counts from: before the first try that carried
        its token, since any of those tries may be the one that granted it. A call given up after
        a try was sent (cancelled, out of tries) gives up what its token may have been granted, on
        the keeper's connections: no one else knows that token."""
        anchor = clock()
        if isinstance(request, AcquireAll):
            # No token to send again: only tries that cannot have been granted are retried.
            call = functools.partial(aio_calls.acquire_with, request=request, token=None)
            return await retrying(connections, self.retry, call, self._limit(request.wait), resend=False), anchor
        tries, token = Tries(self.retry), new_token()
        while True:
            try:
                call = functools.partial(aio_calls.acquire_with, request=request, token=token)
                limit = self._limit(request.wait)
                return await bounded(connections, call, limit, cancel_on_interrupt=True), anchor
            except BaseException as err:
                if not isinstance(err, Exception):
                    # Interrupted (KeyboardInterrupt, a cancelled task): `bounded` has cancelled
                    # the wait on the server. Give up what its token may have been granted.
                    self._give_up(request, token, ttl)
                    raise
                try:
                    pause = tries.pause_or_raise(err)
                except OutcomeUnknown as unknown:
                    self._give_up(request, token, ttl)
                    unknown.token = token
                    raise
                if request.session_bound and outcome_unknown(err):
                    # A grant of that try is bound to its session, which may live on without us
                    # (a partition): give it up before trying again with a new token on a new
                    # session, which would otherwise find the key still held by that grant.
                    await self.keeper().release_now(give_up_query(request, token), ttl, self._limit())
                    token, anchor = new_token(), None
                await asleep(pause)
                anchor = clock() if anchor is None else anchor

    async def _renew_now(self, connections: AsyncConnections, holding: Holding) -> None:
        """A renewal at once, to count the deadline from now; gives the lease up if it fails."""
        sent = clock()
        try:
            renewed = await bounded(
                connections, lambda conn: aio_calls.renew(conn, holding.lease, holding.ttl), self._limit()
            )
        except BaseException:
            self.keeper().give_up(holding.lease.release_query(), holding.ttl, self._limit())
            raise
        holding.renewed(sent, renewed)

    def _give_up(self, request: Acquire, token: Any, ttl: float) -> None:
        """Releases, in the background on the keeper's connections, whatever lease `token` (sent
        with `request`) may hold."""
        self.keeper().give_up(give_up_query(request, token), ttl, self._limit())
