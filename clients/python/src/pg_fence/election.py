"""Leader election on a key, shared by the sync elector (elector.py) and the asyncio one
(aio_elector.py): the statements, what an observer saw last, the elector's options and callbacks,
and what a leadership is beyond a kept lease.

The model is etcd's Election (campaign with a value, proclaim, resign, observe, leader) and
client-go's leader election (callbacks on started and stopped leading and on a new leader, release
on cancel, hand-off to a preferred holder): a leader is the holder of the key's lease, its value the
lease's owner, and its fence fences its writes."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable, Literal, Optional, Sequence, Union

from .errors import LeaseLost, WaitCancelled, WaitTimedOut
from .holding import HELD, RELEASED, UNKNOWN, Holding, KeepPlan
from .lease import Acquire, Lease, Query, Seconds, interval
from .observer import tell
from .reasons import RELEASED as RELEASED_BY_SERVER
from .reasons import LossReason, ended_reason

log = logging.getLogger("pg_fence")

#: Why a leadership ended: the lease was lost (a LossReason), released by resign() (or by the
#: leadership's block ending), handed off to another candidate, or left to expire when cancelled
#: with release_on_cancel=False.
StopReason = Union[LossReason, Literal["released", "handed_off", "cancelled"]]

RESIGNED: StopReason = "released"
HANDED_OFF: StopReason = "handed_off"
CANCELLED: StopReason = "cancelled"

#: How long one wait of a campaign lasts before it is asked again (it stays in the key's queue).
CAMPAIGN_WAIT = 60.0


@dataclass(frozen=True)
class Leader:
    """A key's leader as observers see it: its fence and its value (the lease's owner). Two
    leaders are equal when their fence and value are."""

    fence: int
    owner: str
    acquired_at: Optional[datetime] = field(default=None, compare=False, repr=False)
    expires_at: Optional[datetime] = field(default=None, compare=False, repr=False)


def leader_of(row: Optional[Sequence[Any]]) -> Optional[Leader]:
    """The Leader of an await_change or lease_handoff row (fence, owner, ..., acquired_at,
    expires_at); None for vacancy (a row of NULLs, or no row)."""
    if not row or row[0] is None:
        return None
    return Leader(row[0], row[1], row[-2], row[-1])


def proclaim_query(lease: Lease, value: str) -> Query:
    return ("SELECT fence.lease_proclaim(%s, %s, %s)", (lease.key, lease.token, value))


def handoff_query(lease: Lease, to_owner: str) -> Query:
    return (
        "SELECT fence, owner, acquired_at, expires_at FROM fence.lease_handoff(%s, %s, %s)",
        (lease.key, lease.token, to_owner),
    )


def leader_query(key: str) -> Query:
    """The key's leader now: await_change with no wait returns the current state at once."""
    return Watching(key, 0).query()


_NOTHING_YET = object()


@dataclass(frozen=True)
class Blind:
    """What an observer yields when it cannot reach the server (instead of leaving the leader it
    saw last standing, or taking the silence for a vacancy): by the observed lease's TTL after the
    observer's last answer at the latest. It goes on trying; its next answer is yielded whatever
    it says. `error` is the failure that told it."""

    error: str


class Watching:
    """An observer's loop of await_change: the state it saw last, and whether a row is news. Each
    wait on the server lasts 3/4 of the TTL at most (`ttl`: the elector's, the longest lease it
    expects to see), and each call the TTL: a call unanswered by then means the observer cannot
    see, which it says before the lease it saw could have ended unseen."""

    def __init__(self, key: str, timeout: Seconds, ttl: Optional[Seconds] = None):
        self.key = key
        ttl_seconds = None if ttl is None else interval(ttl).total_seconds()
        seconds = interval(timeout).total_seconds()
        self.call_limit = ttl_seconds
        self.timeout = interval(seconds if ttl_seconds is None else min(seconds, ttl_seconds * 0.75))
        self.seen: Any = _NOTHING_YET
        # Blind since the last answer (told once): the next answer is news whatever it says.
        self.blind = False

    def blinded(self) -> bool:
        """Marks the observer blind; True the first time since its last answer (tell it then)."""
        first, self.blind = not self.blind, True
        return first

    def query(self) -> Query:
        # First a look that does not wait (timeout 0), so that the present is told at once, the
        # vacancy included; then what it saw: the call returns once the state differs.
        first = self.seen is _NOTHING_YET
        seen = None if first else self.seen
        fence, owner = (seen.fence, seen.owner) if seen is not None else (None, None)
        return (
            "SELECT fence, owner, live, acquired_at, expires_at FROM fence.await_change(%s, %s, %s, %s)",
            (self.key, fence, owner, interval(0) if first else self.timeout),
        )

    def news(self, row: Optional[Sequence[Any]]) -> Any:
        """The Leader (or None, vacancy) that `row` shows when it differs from what was seen last;
        NO_NEWS when it does not (the timeout ran out)."""
        leader = leader_of(row)
        first = self.seen is _NOTHING_YET
        if self.blind:
            self.blind = False
            self.seen = leader
            return leader
        if not first and leader == self.seen:
            return NO_NEWS
        self.seen = leader
        return leader


NO_NEWS = object()


class ElectorOptions:
    """What an elector (sync or asyncio) is asked for, and its callbacks (README, Leader election):
    the leadership's lease (`ttl`, `durable`, `session_bound`, `lock_delay`), how it is kept
    (`renew_every`, `margin`, `release_timeout`, as Client.lease), `release_on_cancel`, how long
    one wait of an observer lasts (`observe_timeout`), and on_started_leading(leadership),
    on_stopped_leading(reason), on_new_leader(leader or None)."""

    def __init__(
        self,
        key: str,
        ttl: Seconds,
        *,
        durable: bool = True,
        session_bound: bool = False,
        lock_delay: Seconds = 0,
        renew_every: Optional[Seconds] = None,
        margin: Seconds = 0,
        release_timeout: Seconds = 5,
        release_on_cancel: bool = True,
        observe_timeout: Seconds = 30,
        on_started_leading: Optional[Callable[[Any], Any]] = None,
        on_stopped_leading: Optional[Callable[[StopReason], Any]] = None,
        on_new_leader: Optional[Callable[[Optional[Leader]], Any]] = None,
        on_blind: Optional[Callable[[Blind], Any]] = None,
    ):
        self.key, self.ttl = key, ttl
        self.durable, self.session_bound, self.lock_delay = durable, session_bound, lock_delay
        self.renew_every, self.margin, self.release_timeout = renew_every, margin, release_timeout
        self.release_on_cancel = release_on_cancel
        self.observe_timeout = interval(observe_timeout).total_seconds()
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self.on_blind = on_blind
        self.plan("", None)  # checks the options before anything is sent

    def plan(self, value: str, wait: Optional[float]) -> KeepPlan:
        """A campaign's keep plan for `value`, waiting `wait` seconds (at most CAMPAIGN_WAIT)."""
        chunk = CAMPAIGN_WAIT if wait is None else max(0.0, min(CAMPAIGN_WAIT, wait))
        request = Acquire(
            self.key, self.ttl, value, chunk, self.session_bound, self.durable, lock_delay=self.lock_delay
        )
        return KeepPlan(request, self.renew_every, self.margin, self.release_timeout)

    def new_leader(self, leader: Union[Leader, None, Blind]) -> None:
        if isinstance(leader, Blind):
            call_back("on_blind", self.on_blind, leader)
        else:
            call_back("on_new_leader", self.on_new_leader, leader)


class Campaign:
    """One campaign of an elector: its keep plan for each wait, until `wait` seconds from now
    (None: no end), and which failures of a wait are tried again."""

    def __init__(self, options: ElectorOptions, value: str, wait: Optional[Seconds]):
        self.options, self.value = options, value
        self.end = None if wait is None else time.monotonic() + interval(wait).total_seconds()

    def plan(self) -> KeepPlan:
        left = None if self.end is None else max(0.0, self.end - time.monotonic())
        return self.options.plan(self.value, left)

    def again(self, err: Exception, closed: bool) -> None:
        """Returns when the campaign is to wait again after `err` (its wait ran out, and not the
        campaign's); raises otherwise: WaitCancelled when the elector was closed, else `err`."""
        if closed:
            raise WaitCancelled("the elector was closed") from err
        if not isinstance(err, WaitTimedOut) or (self.end is not None and time.monotonic() >= self.end):
            raise err


def call_back(name: str, callback: Optional[Callable[..., Any]], *args: Any) -> None:
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        log.exception("pg_fence: %s callback failed", name)


class LeadershipView:
    """What a leadership (sync or asyncio) has beyond its kept lease: the elector's options, and the
    callbacks on started and stopped leading, each called once and in that order. Each subclass is a
    kept lease, made with its elector's options before its keeper starts."""

    _holding: Holding
    lost: Any

    def _view(self, options: ElectorOptions) -> None:
        self._options = options
        self._told_lock = threading.Lock()
        self._started_told = False
        self._stop_reason: Optional[StopReason] = None
        self._stop_told = False

    @property
    def value(self) -> str:
        """The leader's value: the owner it was elected with, or last proclaimed."""
        return self._holding.lease.owner

    @property
    def stopped_reason(self) -> Optional[StopReason]:
        """Why the leadership ended (what on_stopped_leading was told); None while it leads."""
        return self._stop_reason

    def _started(self) -> None:
        """on_started_leading, then on_stopped_leading if it ended meanwhile."""
        tell(self._holding.observer, "leadership_gained", self._options.key)
        call_back("on_started_leading", self._options.on_started_leading, self)
        with self._told_lock:
            self._started_told = True
        self._tell_stop()

    def _stopped(self, reason: Optional[StopReason]) -> None:
        """The leadership ended, for `reason` (the loss reason when None): told once, after the start."""
        with self._told_lock:
            if self._stop_reason is None:
                self._stop_reason = reason or self._holding.reason or "unknown"
        self._tell_stop()

    def _tell_stop(self) -> None:
        with self._told_lock:
            if not self._started_told or self._stop_reason is None or self._stop_told:
                return
            self._stop_told = True
        tell(self._holding.observer, "leadership_lost", self._options.key)
        call_back("on_stopped_leading", self._options.on_stopped_leading, self._stop_reason)

    def _after_release(self) -> None:
        """After the holder's release: `lost` set (a leadership's `lost` tells the work that it no
        longer leads, whatever ended it), on_stopped_leading told `released`, or why it was found lost."""
        self.lost.set()
        self._stopped(RESIGNED if self._holding.state == RELEASED else None)

    def _must_lead(self) -> None:
        if self._holding.state != HELD or self._holding.remaining() <= 0:
            label = self._holding.lease.label
            raise LeaseLost(
                label, f"no longer the leader of {label!r}", state=self._holding.state, reason=self._holding.reason
            )

    def _proclaimed(self, value: str, answer: Optional[tuple]) -> bool:
        """Takes lease_proclaim's answer: True when it changed the value."""
        if not (answer and answer[0]):
            return False
        with self._holding._lock:
            lease = self._holding.lease
            assert isinstance(lease, Lease)
            self._holding.lease = replace(lease, owner=value)
        return True

    def _handoff_outcome(self, row: Optional[tuple], status: Optional[Sequence[tuple]]) -> Any:
        """What lease_handoff's `row` means: the new Leader; None when nothing changed; or, for a
        row of NULLs whose lease lease_status (`status`) says ended: HANDED_OFF (released: a retry
        after a hand-off whose answer was lost), or the loss reason (a LossReason)."""
        leader = leader_of(row)
        if leader is not None:
            return leader
        ended = ended_reason(status or (), self._holding.lease.durable)
        if ended is None:
            return None
        return HANDED_OFF if ended == RELEASED_BY_SERVER else ended

    def _handed_off(self) -> None:
        """The hand-off ended the lease: nobody renews or releases it any more."""
        self._holding.declare(RELEASED)
        self.lost.set()
        self._stopped(HANDED_OFF)

    def _abandoned(self) -> None:
        """Cancelled with release_on_cancel=False: the lease is left to expire at its TTL."""
        if self._holding.declare(UNKNOWN, "unknown"):
            self.lost.set()
        self._stopped(CANCELLED)
