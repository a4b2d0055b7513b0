"""The sync client: calls that retry a broken connection, and kept leases."""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from typing import Any, Callable, Iterable, Optional, Tuple, Type, TypeVar

from . import calls
from .connections import APPLICATION_NAME, Connections, bounded, cancel, retrying
from .election import ElectorOptions
from .errors import LeaseLost, OutcomeUnknown, outcome_unknown
from .holding import Holding, KeepPlan, clock
from .keeper import KeptLease, KeptLeaseSet
from .lease import (
    Acquire,
    AcquireAll,
    Held,
    Lease,
    LeaseSet,
    LeaseStatus,
    Query,
    Seconds,
    acquire_all_request,
    interval,
    new_token,
)
from .lease import release_query as release_token_query
from .reasons import UNKNOWN as NO_REASON
from .reasons import loss_reason
from .retry import Retry, Tries

K = TypeVar("K", bound=KeptLease)
T = TypeVar("T")
H = TypeVar("H", Lease, LeaseSet)


class Client:
    """pg_fence through a conninfo (`Client("host=... dbname=...")`) or a psycopg_pool pool
    (`Client(pool=pool)`). Thread-safe. Acquires carry a client-drawn token, so a retry after a
    lost reply gets the lease that reply granted. Each try of a call waits `call_timeout` seconds
    at most (beyond an acquire's `wait`): a stopped server answers nothing."""

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
        self.conninfo = conninfo
        self.pool = pool
        self.retry = retry
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._connections = self.connections()

    def connections(self, pinned: bool = False) -> Connections:
        return Connections(
            self.conninfo,
            self.pool,
            pinned=pinned,
            application_name=self.application_name,
            connect_timeout=self.connect_timeout,
        )

    def _limit(self, wait: Seconds = 0) -> Optional[float]:
        return None if self.call_timeout is None else self.call_timeout + interval(wait).total_seconds()

    def _call(self, call: Callable[[Any], T], wait: Seconds = 0) -> T:
        """`call` on the client's connection, retried."""
        return retrying(self._connections, self.retry, call, self._limit(wait))

    def acquire(
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
        return retrying(
            self._connections, self.retry, lambda conn: calls.acquire_with(conn, request, token), self._limit(wait)
        )

    def acquire_all(
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
        call = functools.partial(calls.acquire_with, request=request, token=None)
        return retrying(self._connections, self.retry, call, self._limit(wait), resend=False)

    def renew(self, lease: Lease, ttl: Seconds) -> Lease:
        """The lease with its new expiry; LeaseLost, with its `reason` (pg_fence.reasons), when its
        token no longer holds it."""
        return self._renewing(lease, lambda conn: calls.renew(conn, lease, ttl))

    def renew_all(self, lease_set: LeaseSet, ttl: Seconds) -> LeaseSet:
        return self._renewing(lease_set, lambda conn: calls.renew_all(conn, lease_set, ttl))

    def _renewing(self, held: H, call: Callable[[Any], H]) -> H:
        try:
            return self._call(call)
        except LeaseLost as lost:
            with contextlib.suppress(Exception):
                rows = bounded(self._connections, lambda conn: calls.rows(conn, held.status_query(), ""), self._limit())
                lost.reason = loss_reason(rows, held.durable, NO_REASON)
            raise

    def status(self, key: str, token: uuid.UUID) -> LeaseStatus:
        """fence.lease_status: whether the lease `token` was granted on `key` is live, or why it ended."""
        return self._call(lambda conn: calls.status(conn, key, token))

    def release(self, lease: Lease) -> bool:
        return self._call(lambda conn: calls.release(conn, lease))

    def release_all(self, lease_set: LeaseSet) -> int:
        return self._call(lambda conn: calls.release_all(conn, lease_set))

    def current_fence(self, key: str) -> Optional[int]:
        return self._call(lambda conn: calls.current_fence(conn, key))

    def lease(
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
        on_lost: Optional[Callable[[KeptLease], None]] = None,
        release_timeout: Seconds = 5,
    ) -> KeptLease:
        """Acquires `key` and keeps it renewed in the background on a connection of its own;
        WaitTimedOut when it is not granted within `wait`. Use it as a context manager, which
        releases on exit; watch `lease.lost` (or pass `on_lost`) to learn that it was lost."""
        request = Acquire(key, ttl, owner, wait, session_bound, durable, shared, permits, lock_delay)
        return self._keep(KeptLease, KeepPlan(request, renew_every, margin, release_timeout), on_lost)

    def lease_set(
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
        on_lost: Optional[Callable[[KeptLease], None]] = None,
        release_timeout: Seconds = 5,
    ) -> KeptLeaseSet:
        """As lease(), for every key of `keys` or none (lease_acquire_all): kept as one, renewed in
        one call (lease_renew_all), lost as one when any of its leases is. An acquire whose
        connection broke mid-call is not tried again (see acquire_all): OutcomeUnknown."""
        request = acquire_all_request(keys, ttl, owner, wait, session_bound, durable)
        return self._keep(KeptLeaseSet, KeepPlan(request, renew_every, margin, release_timeout), on_lost)

    def elector(self, key: str, ttl: Seconds, **options: Any) -> "Elector":
        """Leader election on `key` (README, Leader election; the options are ElectorOptions'):
        campaign(value) waits until elected and keeps the leadership as lease() keeps a lease
        (renewed, lost with its reason); observe() yields every change of leader; callbacks
        on_started_leading(leadership), on_stopped_leading(reason) and on_new_leader(leader or
        None), the last from a thread of its own that observes while the elector is open."""
        return Elector(self, ElectorOptions(key, ttl, **options))

    def _keep(
        self,
        kept: Type[K],
        plan: KeepPlan,
        on_lost: Optional[Callable[[Any], None]],
        connections: Optional[Connections] = None,
    ) -> K:
        """Acquires as `plan` asks, on `connections` (pinned; new ones by default), and keeps it."""
        connections = connections or self.connections(pinned=True)
        try:
            holding = plan.holding(*self._acquire_to_keep(connections, plan.request))
            if holding.anchored_long_ago():
                self._renew_now(connections, holding)
        except BaseException:
            connections.close()
            raise
        return kept(holding, connections, self.retry, on_lost, plan.release_timeout)

    def _acquire_to_keep(self, connections: Connections, request: Acquire) -> Tuple[Optional[Held], float]:
        """The lease and the instant its deadline counts from: before the first try that carried
        its token, since any of those tries may be the one that granted it."""
        anchor = clock()
        if isinstance(request, AcquireAll):
            # No token to send again: only tries that cannot have been granted are retried.
            call = functools.partial(calls.acquire_with, request=request, token=None)
            return retrying(connections, self.retry, call, self._limit(request.wait), resend=False), anchor
        tries, token = Tries(self.retry), new_token()
        while True:
            try:
                call = functools.partial(calls.acquire_with, request=request, token=token)
                return bounded(connections, call, self._limit(request.wait)), anchor
            except BaseException as err:
                if not isinstance(err, Exception):
                    # Interrupted (KeyboardInterrupt): end the wait on the server, and give up
                    # what its token may have been granted.
                    cancel(connections.current())
                    self._give_up(connections, release_token_query(request.key, token))
                    raise
                try:
                    pause = tries.pause_or_raise(err)
                except OutcomeUnknown as unknown:
                    self._give_up(connections, release_token_query(request.key, token))
                    unknown.token = token
                    raise
                if request.session_bound and outcome_unknown(err):
                    # A grant of that try is bound to its session, which may live on without us
                    # (a partition): give it up, and try again with a new token on a new session.
                    self._give_up(connections, release_token_query(request.key, token))
                    token, anchor = new_token(), None
                time.sleep(pause)
                anchor = clock() if anchor is None else anchor

    def _renew_now(self, connections: Connections, holding: Holding) -> None:
        """A renewal at once, to count the deadline from now; gives the lease up if it fails."""
        sent = clock()
        try:
            renewed = bounded(connections, lambda conn: calls.renew(conn, holding.lease, holding.ttl), self._limit())
        except BaseException:
            self._give_up(connections, holding.lease.release_query())
            raise
        holding.renewed(sent, renewed)

    def _give_up(self, connections: Connections, release: Query) -> None:
        """Releases, best effort, whatever lease the token of `release` may hold."""
        with contextlib.suppress(Exception):
            bounded(connections, lambda conn: calls.one(conn, release, ""), self._limit())

    def close(self) -> None:
        self._connections.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


from .elector import Elector  # noqa: E402 (it builds on the client)
