"""What a kept lease knows between renewals, shared by the sync and the asyncio keeper.

The local deadline is the rule that keeps "the server is unreachable" from passing for "still
held": a renewal's clock starts just *before* its request is sent, so `sent + ttl` comes no later
than the expiry the server sets (which starts when the server runs it), as long as the two clocks
run at the same rate; `margin` allows for them not to. Deadlines are kept on CLOCK_BOOTTIME,
which, as the server's clock, runs on while the machine is suspended. At the deadline, with no renewal confirmed,
the lease is declared lost with state "unknown": the server may still hold it, but only for a
moment, and nobody can tell which (its reason `unreachable`). PF001 from the server makes it "lost",
with the reason the server's lease_status gives (reasons.py)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from .errors import LeaseLost, WaitTimedOut, outcome_unknown
from .lease import Acquire, Held, LeaseSet, Query, Seconds, interval
from .observer import Observer, tell
from .reasons import EXPIRED, TAKEN_OVER, UNREACHABLE, LossReason
from .reasons import RELEASED as ENDED_BY_RELEASE
from .reasons import UNKNOWN as NO_REASON

HELD, LOST, UNKNOWN, RELEASED = "held", "lost", "unknown", "released"

# CLOCK_BOOTTIME runs on while the machine is suspended, as the server's clock does; the
# monotonic clock stops, and a lease would look held long after the server expired it.
_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def clock() -> float:
    """Seconds on the clock that deadlines are kept by."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


def check_timing(ttl: float, renew_every: Optional[float], margin: float) -> None:
    """Refuses, before anything is acquired, a renewal interval that leaves no time to renew."""
    every = renew_every if renew_every is not None else ttl / 3
    if not 0 < every < ttl - max(margin, ttl / 100):
        raise ValueError("renew_every must be above 0 and below the ttl less its margin (1 % of the ttl at least)")


class KeepPlan:
    """What a kept lease (or set) is asked for, checked before anything is sent."""

    def __init__(self, request: Acquire, renew_every: Optional[Seconds], margin: Seconds, release_timeout: Seconds):
        self.request = request
        self.ttl = request.seconds()[0]
        self.every = None if renew_every is None else interval(renew_every).total_seconds()
        self.margin = interval(margin).total_seconds()
        self.release_timeout = interval(release_timeout).total_seconds()
        check_timing(self.ttl, self.every, self.margin)

    def holding(self, granted: Optional[Held], sent_at: float) -> "Holding":
        """The Holding of what was granted; WaitTimedOut when nothing was."""
        if granted is None:
            raise WaitTimedOut(f"lease on {self.request.label!r} not granted within {interval(self.request.wait)}")
        return Holding(granted, self.ttl, sent_at, self.every, self.margin, self.request.session_bound)


class Holding:
    def __init__(
        self,
        lease: Held,
        ttl: float,
        sent_at: float,
        renew_every: Optional[float],
        margin: float,
        session_bound: bool,
    ):
        self.lease = lease
        self.ttl = ttl
        self.renew_every = renew_every if renew_every is not None else ttl / 3
        # A margin of 1 % of the ttl at least: clocks of both machines may run 1 % apart.
        self.margin = max(margin, ttl / 100)
        check_timing(ttl, renew_every, margin)
        self.session_bound = session_bound
        self.sent_at = sent_at
        self.deadline = sent_at + ttl - self.margin
        self.next_renewal = sent_at + self.renew_every
        self.state = HELD
        self.lost_at: Optional[float] = None
        #: Why it was lost (reasons.py): set with the state "lost" or "unknown".
        self.reason: Optional[LossReason] = None
        self.last_error: Optional[BaseException] = None
        self.failures = 0
        self._lock = threading.Lock()
        #: The client's observer (observer.py) and the kept lease it is told about: set by the
        #: client once the lease is kept (observe).
        self.observer: Optional[Observer] = None
        self.kept: Any = None
        self._start_told = False
        self._end_told = False

    def renewed(self, sent_at: float, lease: Held) -> bool:
        """Takes a confirmed renewal; False if the lease was already declared lost or released."""
        with self._lock:
            if self.state != HELD:
                return False
            self.lease = lease
            self.deadline = sent_at + self.ttl - self.margin
            self.next_renewal = sent_at + self.renew_every
            self.failures = 0
            return True

    def declare(self, state: str, reason: Optional[LossReason] = None) -> bool:
        """Moves a held lease to `state`, lost for `reason` (by default `unreachable` for "unknown"
        and `unknown` for "lost"); True for the one call that did, which tells the work."""
        with self._lock:
            if self.state != HELD:
                return False
            self.state = state
            if state != RELEASED:
                self.lost_at = clock()
                self.reason = reason or (UNREACHABLE if state == UNKNOWN else NO_REASON)
        self.ended(lost=state != RELEASED)
        return True

    def observe(self, observer: Optional[Observer], kept: Any) -> None:
        """Tells `observer` that `kept` keeps this lease, unless it ended already; and of its end."""
        if observer is None:
            return
        with self._lock:
            self.observer, self.kept = observer, kept
            if self._end_told:
                return
            self._start_told = True
        tell(observer, "kept_lease_started", kept)

    def ended(self, lost: bool = False) -> None:
        """Tells the observer, once, that the lease is kept no more (and lost, with its reason)."""
        with self._lock:
            told, self._end_told = self._start_told and not self._end_told, True
            observer, reason = self.observer, self.reason
        if told:
            tell(observer, "kept_lease_ended", self.kept)
        if lost and self._start_told:
            tell(observer, "lease_lost", self.kept, reason)

    def anchored_long_ago(self) -> bool:
        """Whether the grant came long after the instant its deadline counts from (a long wait,
        retries after a lost reply): then it needs a renewal at once to count from now."""
        return clock() - self.sent_at > self.renew_every / 2

    def release_wanted(self) -> bool:
        """Whether the holder's release must ask the server: for a held lease, and an unknown one,
        which may still be live there (releasing it frees the key at once); and for a lost set,
        whose other leases may be."""
        return self.state in (HELD, UNKNOWN) or (self.state == LOST and isinstance(self.lease, LeaseSet))

    def give_up_after(self, err: BaseException) -> bool:
        """Whether the keeper must release by the token at once after the loss `err`: a session-bound
        lease whose session we lost may live on in it (a partition), holding the key; a set of which
        one lease was lost (PF001) still holds the others, for nothing."""
        return not isinstance(err, LeaseLost) or isinstance(self.lease, LeaseSet)

    def released(self, answer: Optional[bool], reason: Optional[str] = None) -> None:
        """Takes the outcome of the holder's release: "released" only when the server said that it
        ended the lease; "lost" when it said the token no longer held it, for `reason` (what its
        lease_status said, reasons.ended_reason: "released" when an earlier try of this release
        ended it, whose answer was lost); "unknown" when no answer came, as the lease may then stay
        live until its TTL. A lease declared unknown at its deadline learns here what became of it."""
        if answer is False and reason == ENDED_BY_RELEASE:
            answer, reason = True, None
        with self._lock:
            if self.state not in (HELD, UNKNOWN) or (answer is None and self.state == UNKNOWN):
                return
            was_held = self.state == HELD
            self.state = UNKNOWN if answer is None else RELEASED if answer else LOST
            if answer:
                self.reason = None
            else:
                self.reason = UNREACHABLE if answer is None else reason or NO_REASON  # type: ignore[assignment]
            if self.state != RELEASED and self.lost_at is None:
                self.lost_at = clock()
        self.ended(lost=was_held and self.state == LOST)

    def expired(self) -> bool:
        """Lost by expiry: the key may have been taken over since, which a release can learn."""
        return self.state == LOST and self.reason == EXPIRED

    def refine(self, reason: Optional[str]) -> None:
        """An expired lease's reason once the server says another took the key over since."""
        with self._lock:
            if self.state == LOST and self.reason == EXPIRED and reason == TAKEN_OVER:
                self.reason = TAKEN_OVER

    def remaining(self) -> float:
        return self.deadline - clock()

    def held(self) -> bool:
        """Held, and its local deadline not passed, whether or not the keeper has run since."""
        return self.state == HELD and self.remaining() > 0

    def statement_timeout(self) -> Query:
        """A renewal that takes longer than the time left is of no use: the server may end it.
        Local to the renewal's transaction, so a pool's connection goes back unchanged."""
        return ("SELECT set_config('statement_timeout', %s, true)", (str(max(1, int(self.remaining() * 1000))),))

    def attempt_limit(self) -> float:
        """How long one try of a renewal may take: until the deadline for a session-bound lease,
        which ends with its connection anyway; otherwise no longer than the interval, so that a
        try hung on one connection leaves time for another on a new one."""
        left = max(0.0, self.remaining())
        return left if self.session_bound else min(self.renew_every, left)

    def renewal_failed(self, err: BaseException, pause: Callable[[int], float]) -> bool:
        """Whether the failure `err` of a renewal means the lease is lost; if not, schedules the
        next try after a jittered pause, before the deadline."""
        self.last_error = err
        # A session-bound lease ends with its session, and a broken connection is that session.
        if isinstance(err, LeaseLost) or (self.session_bound and outcome_unknown(err)):
            return True
        self.next_renewal = min(clock() + pause(self.failures), self.deadline)
        self.failures += 1
        return False
