"""Leader election: AsyncClient.elector(key, ttl, ...) campaigns for the key, observes its leaders,
and hands leadership over (election.py has what is neither sync nor asyncio). A cancel (a
KeyboardInterrupt; in pg_fence.aio, a cancelled task) ends a campaign's wait on the server, leaving
nothing granted, and resigns a leadership whose block it leaves (or, with release_on_cancel=False,
leaves its lease to expire)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from typing import Any, AsyncIterator, Iterator, List, Optional, Union

from . import aio_calls
from .aio_caller import AsyncCaller, retrying
from .aio_connections import AsyncConnections, bounded, cancel
from .aio_keeper import AsyncKeptLease
from .concurrency import AEvent, aspawn
from .election import (
    HANDED_OFF,
    NO_NEWS,
    Blind,
    Campaign,
    ElectorOptions,
    Leader,
    LeadershipView,
    Watching,
    handoff_query,
    leader_of,
    leader_query,
    log,
    proclaim_query,
)
from .errors import WaitCancelled, WaitTimedOut
from .holding import HELD, LOST
from .lease import Seconds
from .retry import Tries


class AsyncLeadership(LeadershipView, AsyncKeptLease):
    """The leader's kept lease (`fence`, `lost`, `state`, `reason`, `guard`, `fenced_update`, ...),
    with proclaim, hand-off and resign. Leaving its block resigns; a cancel leaves the lease to
    expire instead when the elector was made with release_on_cancel=False."""

    def __init__(self, *args: Any, options: ElectorOptions):
        self._view(options)
        super().__init__(*args)

    async def proclaim(self, value: str) -> None:
        """Changes the leader's value (the lease's owner), keeping its fence: observers see the
        new value. LeaseLost (with its reason) when no longer the leader."""
        self._must_lead()
        async with self._renewing:
            answer = await self._call(lambda conn: aio_calls.one(conn, proclaim_query(self.lease, value), self.key))
            if not self._proclaimed(value, answer):
                self._lost(await self._status(self._connections, self._release_timeout))

    async def handoff(self, to_owner: str) -> Optional[Leader]:
        """Ends this leadership and hands the key, with a higher fence, to the candidate campaigning
        with the value `to_owner`, ahead of the others: the new Leader (on_stopped_leading:
        `handed_off`). None, changing nothing, when no such candidate waits. LeaseLost when no
        longer the leader."""
        self._must_lead()
        async with self._renewing:
            row = await self._call(lambda conn: aio_calls.one(conn, handoff_query(self.lease, to_owner), self.key))
            found = row and row[0] is not None
            status = None if found else await self._status(self._connections, self._release_timeout)
            outcome = self._handoff_outcome(row, status)
            if outcome is None:
                return None
            if outcome == HANDED_OFF:  # it happened, and its answer was lost: who leads now
                outcome = leader_of(
                    await self._call(lambda conn: aio_calls.one(conn, leader_query(self.key), self.key))
                )
            elif not isinstance(outcome, Leader):
                self._lost(status)
            self._handed_off()
        self._stop_renewing()
        return outcome

    async def resign(self) -> bool:
        """Releases the leadership: True when the server said so (on_stopped_leading: `released`);
        False when it had ended already (on_stopped_leading has told why)."""
        return await self.release()

    async def release(self) -> bool:
        """As resign()."""
        released = await super().release()
        self._after_release()
        return released

    async def __aexit__(self, kind: Any, *exc: object) -> None:
        if kind is not None and not issubclass(kind, Exception):
            await self._cancelled()
        else:
            await self.resign()

    async def _cancelled(self) -> None:
        """A cancel: resign, or with release_on_cancel=False stop renewing and leave the lease to
        expire at its TTL."""
        if self._options.release_on_cancel:
            await self.resign()
            return
        self._abandoned()
        await self._let_expire()

    async def _call(self, call: Any) -> Any:
        """`call` on the lease's connection, retried as the client retries; with `_renewing` held."""
        return await retrying(self._connections, self._retry, call, self._release_timeout)

    def _lost(self, status: Optional[list]) -> None:
        """The server said the lease is not held: lost, for the reason lease_status (`status`) gives."""
        self._declare(LOST, self._reason_of(status))
        self.check()


class AsyncElector:
    """Campaigns for `key`, observes its leaders and calls back (see Client.elector). Thread-safe.
    Close it (or use it as a context manager) to stop a campaign in progress, the on_new_leader
    watcher and the observers, and to end its leaderships (released, or left to expire with
    release_on_cancel=False). In pg_fence.aio, make it in a coroutine (its on_new_leader watcher
    is a task), and close it with `await elector.close()` or `async with`."""

    def __init__(self, client: AsyncCaller, options: ElectorOptions):
        self._client = client
        self.options = options
        self.key = options.key
        self._closed = AEvent()
        # The lists are close()'s too, which another thread may call.
        self._lock = threading.Lock()
        self._busy: List[AsyncConnections] = []  # campaigns and observers, whose statements close() cancels
        self._leaderships: List[AsyncLeadership] = []
        self._watcher = None if options.on_new_leader is None else aspawn(self._watch, f"pg_fence elector {self.key}")

    async def campaign(self, value: str, *, wait: Optional[Seconds] = None) -> AsyncLeadership:
        """Waits until elected with `value` (the lease's owner, which observers see), at most `wait`
        seconds (None: until elected; WaitTimedOut when it runs out), and returns the leadership,
        kept renewed; calls on_started_leading(leadership). WaitCancelled when the elector is closed
        meanwhile (nothing is left granted)."""
        campaign = Campaign(self.options, value, wait)
        while True:
            self._check_open()
            connections = self._client.connections(pinned=True)
            with self._using(connections):
                try:
                    leader = functools.partial(AsyncLeadership, options=self.options)
                    leadership = await self._client._keep(leader, campaign.plan(), self._on_lost, connections)
                    break
                except (WaitTimedOut, WaitCancelled) as err:
                    campaign.again(err, self._closed.is_set())
        with self._lock:
            self._leaderships = [held for held in self._leaderships if held.state == HELD] + [leadership]
        if self._closed.is_set():
            await leadership._cancelled()
            raise WaitCancelled("the elector was closed")
        leadership._started()
        return leadership

    async def leader(self) -> Optional[Leader]:
        """The key's leader now; None when nobody leads."""
        return leader_of(await self._client._call(lambda conn: aio_calls.one(conn, leader_query(self.key), self.key)))

    async def observe(self) -> AsyncIterator[Union[Leader, None, Blind]]:
        """The key's leaders as they change: first the present, at once (the leader, or None),
        then every change: a new leader (a higher fence), a new value proclaimed (the same fence),
        None when nobody leads (a resign, a revoke, an expiry, a session's end, a fast lease lost in
        a crash). Blind when it cannot reach the server, within the elector's TTL of its last
        answer (not the old leader again, nor a vacancy); it reconnects and goes on, and its next
        answer is yielded whatever it says. Ends when the elector is closed; raises what the
        client's retries could not get past (an outage longer than Retry.total)."""
        connections = self._client.connections(pinned=True)
        watching = Watching(self.key, self.options.observe_timeout, self.options.ttl)
        limit = watching.call_limit or self._client._limit(self.options.observe_timeout)
        tries = Tries(self._client.retry)
        try:
            with self._using(connections):
                while not self._closed.is_set():
                    try:
                        row = await bounded(connections, lambda c: aio_calls.one(c, watching.query(), self.key), limit)
                    except Exception as err:
                        if self._closed.is_set():
                            return
                        pause = tries.pause_or_raise(err)
                        if watching.blinded():
                            yield Blind(f"{type(err).__name__}: {err}")
                        await self._closed.wait_timeout(pause)
                        continue
                    tries = Tries(self._client.retry)
                    news = watching.news(row)
                    if news is not NO_NEWS:
                        yield news
        finally:
            await connections.close()

    async def close(self) -> None:
        self._closed.set()
        with self._lock:
            busy, leaderships = list(self._busy), list(self._leaderships)
        for connections in busy:
            await cancel(connections.current())
        for leadership in leaderships:
            await leadership._cancelled()
        if True:  # ASYNC
            if self._watcher is not None and self._watcher is not asyncio.current_task():
                self._watcher.cancel()
                with contextlib.suppress(BaseException):
                    await self._watcher
        else:
            # The watcher ends by itself once closed: its statement was cancelled above.
            if self._watcher is not None and self._watcher is not threading.current_thread():
                self._watcher.join(5)

    async def __aenter__(self) -> "AsyncElector":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise WaitCancelled("the elector was closed")

    @contextlib.contextmanager
    def _using(self, connections: AsyncConnections) -> Iterator[None]:
        with self._lock:
            self._busy.append(connections)
        try:
            yield
        finally:
            with self._lock:
                self._busy.remove(connections)

    def _on_lost(self, leadership: AsyncLeadership) -> None:
        leadership._stopped(None)

    async def _watch(self) -> None:
        """on_new_leader's thread (task): observes until closed, starting again after a failure."""
        while not self._closed.is_set():
            try:
                async for leader in self.observe():
                    self.options.new_leader(leader)
            except Exception:
                log.warning("pg_fence: observing %r failed; again in a second", self.key, exc_info=True)
                await self._closed.wait_timeout(1.0)
