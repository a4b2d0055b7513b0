"""What a kept lease knows between renewals, shared by the sync and the asyncio keeper.

The local deadline is the rule that keeps "the server is unreachable" from passing for "still
held": a renewal's clock starts just *before* its request is sent, so `sent + ttl` comes no later
than the expiry the server sets (which starts when the server runs it), as long as the two clocks
run at the same rate; `margin` allows for them not to. At the deadline, with no renewal confirmed,
the lease is declared lost with state "unknown": the server may still hold it, but only for a
moment, and nobody can tell which. PF001 from the server makes it "lost"."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from .errors import LeaseLost, outcome_unknown
from .lease import Lease, Query

HELD, LOST, UNKNOWN, RELEASED = "held", "lost", "unknown", "released"


class Holding:
    def __init__(
        self,
        lease: Lease,
        ttl: float,
        sent_at: float,
        renew_every: Optional[float],
        margin: float,
        session_bound: bool,
    ):
        if renew_every is not None and not 0 < renew_every < ttl:
            raise ValueError("renew_every must be above 0 and below the ttl")
        self.lease = lease
        self.ttl = ttl
        self.renew_every = renew_every if renew_every is not None else ttl / 3
        # A margin of 1 % of the ttl at least: clocks of both machines may run 1 % apart.
        self.margin = max(margin, ttl / 100)
        self.session_bound = session_bound
        self.sent_at = sent_at
        self.deadline = sent_at + ttl - self.margin
        self.next_renewal = sent_at + self.renew_every
        self.state = HELD
        self.lost_at: Optional[float] = None
        self.last_error: Optional[BaseException] = None
        self.failures = 0
        self._lock = threading.Lock()

    def renewed(self, sent_at: float, lease: Lease) -> bool:
        """Takes a confirmed renewal; False if the lease was already declared lost or released."""
        with self._lock:
            if self.state != HELD:
                return False
            self.lease = lease
            self.deadline = sent_at + self.ttl - self.margin
            self.next_renewal = sent_at + self.renew_every
            self.failures = 0
            return True

    def declare(self, state: str) -> bool:
        """Moves a held lease to `state`; True for the one call that did, which tells the work."""
        with self._lock:
            if self.state != HELD:
                return False
            self.state = state
            if state != RELEASED:
                self.lost_at = time.monotonic()
            return True

    def renew_at_once_if_slow(self) -> None:
        """A grant that took long (a wait, a retry after a lost reply) anchored the deadline at its
        first try, well before the grant: renew at once to anchor it again."""
        if time.monotonic() - self.sent_at > self.renew_every / 2:
            self.next_renewal = time.monotonic()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def held(self) -> bool:
        """Held, and its local deadline not passed, whether or not the keeper has run since."""
        return self.state == HELD and self.remaining() > 0

    def statement_timeout(self) -> Query:
        """A renewal that takes longer than the time left is of no use: the server may end it."""
        return ("SELECT set_config('statement_timeout', %s, false)", (str(max(1, int(self.remaining() * 1000))),))

    def renewal_failed(self, err: BaseException, pause: Callable[[int], float]) -> bool:
        """Whether the failure `err` of a renewal means the lease is lost; if not, schedules the
        next try after a jittered pause, before the deadline."""
        self.last_error = err
        # A session-bound lease ends with its session, and a broken connection is that session.
        if isinstance(err, LeaseLost) or (self.session_bound and outcome_unknown(err)):
            return True
        self.next_renewal = min(time.monotonic() + pause(self.failures), self.deadline)
        self.failures += 1
        return False
