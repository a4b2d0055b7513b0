"""Leader election, sync: Client.elector(key, ttl, ...) campaigns for the key, observes its
leaders, and hands leadership over (election.py has what the asyncio elector shares)."""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

from . import calls
from .connections import Connections, cancel, retrying
from .election import (
    HANDED_OFF,
    NO_NEWS,
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
from .keeper import KeptLease
from .lease import Seconds

if TYPE_CHECKING:
    from .client import Client


class Leadership(LeadershipView, KeptLease):
    """The leader's kept lease (a KeptLease: `fence`, `lost`, `state`, `reason`, `guard`,
    `fenced_update`, ...), with proclaim, hand-off and resign. Leaving its block resigns; a
    KeyboardInterrupt (a cancel) leaves the lease to expire instead when the elector was made with
    release_on_cancel=False."""

    def __init__(self, *args: Any, options: ElectorOptions):
        self._view(options)
        super().__init__(*args)

    def proclaim(self, value: str) -> None:
        """Changes the leader's value (the lease's owner), keeping its fence: observers see the
        new value. LeaseLost (with its reason) when no longer the leader."""
        self._must_lead()
        with self._renewing:
            answer = self._call(lambda conn: calls.one(conn, proclaim_query(self.lease, value), self.key))
            if not self._proclaimed(value, answer):
                self._lost(self._status(self._connections, self._release_timeout))

    def handoff(self, to_owner: str) -> Optional[Leader]:
        """Ends this leadership and hands the key, with a higher fence, to the candidate campaigning
        with the value `to_owner`, ahead of the others: the new Leader (on_stopped_leading:
        `handed_off`). None, changing nothing, when no such candidate waits. LeaseLost when no
        longer the leader."""
        self._must_lead()
        with self._renewing:
            row = self._call(lambda conn: calls.one(conn, handoff_query(self.lease, to_owner), self.key))
            status = None if row and row[0] is not None else self._status(self._connections, self._release_timeout)
            outcome = self._handoff_outcome(row, status)
            if outcome is None:
                return None
            if outcome == HANDED_OFF:  # it happened, and its answer was lost: who leads now
                outcome = leader_of(self._call(lambda conn: calls.one(conn, leader_query(self.key), self.key)))
            elif not isinstance(outcome, Leader):
                self._lost(status)
            self._handed_off()
        self._stop_renewing()
        return outcome

    def resign(self) -> bool:
        """Releases the leadership: True when the server said so (on_stopped_leading: `released`);
        False when it had ended already (on_stopped_leading has told why)."""
        return self.release()

    def release(self) -> bool:
        """As resign()."""
        released = super().release()
        self._after_release()
        return released

    def __exit__(self, kind: Any, *exc: object) -> None:
        if kind is not None and not issubclass(kind, Exception):
            self._cancelled()
        else:
            self.resign()

    def _cancelled(self) -> None:
        """A cancel: resign, or with release_on_cancel=False stop renewing and leave the lease to
        expire at its TTL."""
        if self._options.release_on_cancel:
            self.resign()
            return
        self._release_wanted = False
        self._abandoned()
        self._stop.set()

    def _call(self, call: Any) -> Any:
        """`call` on the lease's connection, retried as the client retries; with `_renewing` held."""
        return retrying(self._connections, self._retry, call, self._release_timeout)

    def _lost(self, status: Optional[list]) -> None:
        """The server said the lease is not held: lost, for the reason lease_status (`status`) gives."""
        self._declare(LOST, self._reason_of(status))
        self.check()


class Elector:
    """Campaigns for `key`, observes its leaders and calls back (see Client.elector). Thread-safe.
    Close it (or use it as a context manager) to stop a campaign in progress, the on_new_leader
    watcher and the observers, and to end its leaderships (released, or left to expire with
    release_on_cancel=False)."""

    def __init__(self, client: "Client", options: ElectorOptions):
        self._client = client
        self.options = options
        self.key = options.key
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._busy: List[Connections] = []  # campaigns and observers, whose statements close() cancels
        self._leaderships: List[Leadership] = []
        self._watcher: Optional[threading.Thread] = None
        if options.on_new_leader is not None:
            self._watcher = threading.Thread(target=self._watch, name=f"pg_fence elector {self.key}", daemon=True)
            self._watcher.start()

    def campaign(self, value: str, *, wait: Optional[Seconds] = None) -> Leadership:
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
                    leader = functools.partial(Leadership, options=self.options)
                    leadership = self._client._keep(leader, campaign.plan(), self._on_lost, connections)
                    break
                except (WaitTimedOut, WaitCancelled) as err:
                    campaign.again(err, self._closed.is_set())
        with self._lock:
            self._leaderships = [held for held in self._leaderships if held.state == HELD] + [leadership]
        if self._closed.is_set():
            leadership._cancelled()
            raise WaitCancelled("the elector was closed")
        leadership._started()
        return leadership

    def leader(self) -> Optional[Leader]:
        """The key's leader now; None when nobody leads."""
        return leader_of(self._client._call(lambda conn: calls.one(conn, leader_query(self.key), self.key)))

    def observe(self) -> Iterator[Optional[Leader]]:
        """The key's leaders as they change: the first leader (at once, or when one is elected),
        then every change: a new leader (a higher fence), a new value proclaimed (the same fence),
        None when nobody leads (a resign, a revoke, an expiry, a session's end, a fast lease lost in
        a crash). Ends when the elector is closed; raises what the client's retries could not get
        past (an outage longer than Retry.total)."""
        connections = self._client.connections(pinned=True)
        watching = Watching(self.key, self.options.observe_timeout)
        limit = self._client._limit(self.options.observe_timeout)
        try:
            with self._using(connections):
                while not self._closed.is_set():
                    try:
                        row = retrying(
                            connections, self._client.retry, lambda c: calls.one(c, watching.query(), self.key), limit
                        )
                    except Exception:
                        if self._closed.is_set():
                            return
                        raise
                    news = watching.news(row)
                    if news is not NO_NEWS:
                        yield news
        finally:
            connections.close()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            busy, leaderships = list(self._busy), list(self._leaderships)
        for connections in busy:
            cancel(connections.current())
        for leadership in leaderships:
            leadership._cancelled()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(5)

    def __enter__(self) -> "Elector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise WaitCancelled("the elector was closed")

    @contextlib.contextmanager
    def _using(self, connections: Connections) -> Iterator[None]:
        with self._lock:
            self._busy.append(connections)
        try:
            yield
        finally:
            with self._lock:
                self._busy.remove(connections)

    def _on_lost(self, leadership: Leadership) -> None:
        leadership._stopped(None)

    def _watch(self) -> None:
        """on_new_leader's thread: observes until closed, starting again after a failure."""
        while not self._closed.is_set():
            try:
                for leader in self.observe():
                    self.options.new_leader(leader)
            except Exception:
                log.warning("pg_fence: observing %r failed; again in a second", self.key, exc_info=True)
                self._closed.wait(1.0)
