"""As elector.py, for asyncio: AsyncClient.elector(key, ttl, ...). A cancelled task is the cancel:
a campaign's wait ends on the server (nothing stays granted), and a leadership whose block a
cancellation leaves is resigned (or, with release_on_cancel=False, left to expire)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING, Any, AsyncIterator, List, Optional

from . import election
from .aio import AsyncConnections, cancel, one, retrying
from .aio_keeper import AsyncKeptLease
from .election import ElectorOptions, Leader
from .errors import WaitCancelled, WaitTimedOut
from .holding import HELD, LOST
from .lease import Seconds

if TYPE_CHECKING:
    from .aio import AsyncClient


class AsyncLeadership(election.LeadershipView, AsyncKeptLease):
    """As pg_fence.elector.Leadership: `async with` it; its calls are coroutines."""

    def __init__(self, *args: Any, options: ElectorOptions):
        self._view(options)
        super().__init__(*args)

    async def proclaim(self, value: str) -> None:
        """As Leadership.proclaim."""
        self._must_lead()
        async with self._renewing:
            answer = await self._call(lambda conn: one(conn, election.proclaim_query(self.lease, value), self.key))
            if not self._proclaimed(value, answer):
                self._lost(await self._status(self._connections, self._release_timeout))

    async def handoff(self, to_owner: str) -> Optional[Leader]:
        """As Leadership.handoff."""
        self._must_lead()
        async with self._renewing:
            row = await self._call(lambda conn: one(conn, election.handoff_query(self.lease, to_owner), self.key))
            found = row and row[0] is not None
            status = None if found else await self._status(self._connections, self._release_timeout)
            outcome = self._handoff_outcome(row, status)
            if outcome is None:
                return None
            if outcome == election.HANDED_OFF:
                outcome = election.leader_of(
                    await self._call(lambda conn: one(conn, election.leader_query(self.key), self.key))
                )
            elif not isinstance(outcome, Leader):
                self._lost(status)
            self._handed_off()
        self._stop_renewing()
        return outcome

    async def resign(self) -> bool:
        """As Leadership.resign."""
        return await self.release()

    async def release(self) -> bool:
        released = await super().release()
        self._after_release()
        return released

    async def __aexit__(self, kind: Any, *exc: object) -> None:
        if kind is not None and not issubclass(kind, Exception):
            await self._cancelled()
        else:
            await self.resign()

    async def _cancelled(self) -> None:
        """As Leadership._cancelled."""
        if self._options.release_on_cancel:
            await self.resign()
            return
        self._abandoned()
        for task in (self._watchdog, self._renewer):
            task.cancel()
        await self._connections.close()

    async def _call(self, call: Any) -> Any:
        return await retrying(self._connections, self._retry, call, self._release_timeout)

    def _lost(self, status: Optional[list]) -> None:
        self._declare(LOST, self._reason_of(status))
        self.check()


class AsyncElector:
    """As pg_fence.elector.Elector; make it in a coroutine (its on_new_leader watcher is a task)
    and close it with `await elector.close()` or `async with`."""

    def __init__(self, client: "AsyncClient", options: ElectorOptions):
        self._client = client
        self.options = options
        self.key = options.key
        self._closed = asyncio.Event()
        self._busy: List[AsyncConnections] = []
        self._leaderships: List[AsyncLeadership] = []
        self._watcher: Optional[asyncio.Task] = None
        if options.on_new_leader is not None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def campaign(self, value: str, *, wait: Optional[Seconds] = None) -> AsyncLeadership:
        """As Elector.campaign; cancelling the task that awaits it ends the campaign's wait on the
        server and gives up whatever it may have been granted."""
        campaign = election.Campaign(self.options, value, wait)
        while True:
            self._check_open()
            connections = self._client.connections(pinned=True)
            self._busy.append(connections)
            try:
                leader = functools.partial(AsyncLeadership, options=self.options)
                leadership = await self._client._keep(leader, campaign.plan(), self._on_lost, connections)
                break
            except (WaitTimedOut, WaitCancelled) as err:
                campaign.again(err, self._closed.is_set())
            finally:
                self._busy.remove(connections)
        self._leaderships = [held for held in self._leaderships if held.state == HELD] + [leadership]
        if self._closed.is_set():
            await leadership._cancelled()
            raise WaitCancelled("the elector was closed")
        leadership._started()
        return leadership

    async def leader(self) -> Optional[Leader]:
        """As Elector.leader."""
        return election.leader_of(
            await self._client._call(lambda conn: one(conn, election.leader_query(self.key), self.key))
        )

    async def observe(self) -> AsyncIterator[Optional[Leader]]:
        """As Elector.observe, an async iterator."""
        connections = self._client.connections(pinned=True)
        watching = election.Watching(self.key, self.options.observe_timeout)
        limit = self._client._limit(self.options.observe_timeout)
        self._busy.append(connections)
        try:
            while not self._closed.is_set():
                try:
                    row = await retrying(
                        connections, self._client.retry, lambda c: one(c, watching.query(), self.key), limit
                    )
                except Exception:
                    if self._closed.is_set():
                        return
                    raise
                news = watching.news(row)
                if news is not election.NO_NEWS:
                    yield news
        finally:
            self._busy.remove(connections)
            await connections.close()

    async def close(self) -> None:
        self._closed.set()
        for connections in list(self._busy):
            await cancel(connections.current())
        for leadership in list(self._leaderships):
            await leadership._cancelled()
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
            with contextlib.suppress(BaseException):
                await self._watcher

    async def __aenter__(self) -> "AsyncElector":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise WaitCancelled("the elector was closed")

    def _on_lost(self, leadership: AsyncLeadership) -> None:
        leadership._stopped(None)

    async def _watch(self) -> None:
        """As Elector._watch."""
        while not self._closed.is_set():
            try:
                async for leader in self.observe():
                    self.options.new_leader(leader)
            except Exception:
                election.log.warning("pg_fence: observing %r failed; again in a second", self.key, exc_info=True)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), 1.0)
